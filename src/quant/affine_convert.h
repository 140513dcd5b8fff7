// Writing an MLX affine checkpoint from a dense one, as mlx_lm.convert --quantize lays it out: which modules
// are quantized, mlx-lm's mixed recipes, config.json with `quantization` and `quantization_config`, sharded
// safetensors with an index, and the tokenizer files. Streams one tensor at a time (the input mapped, one
// tensor's output in memory). The model-specific part (which tensors a model has) comes from the caller.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "quant/affine.h"
#include "quant/trellis_convert.h"
#include "quant/trellis_encode.h"
#include "quant/trellis_ldlq.h"

namespace arbor {
class ThreadPool;
}

namespace arbor::quant {

// mlx-lm's --quant-predicate recipes: low bits everywhere, high bits for the LM head and for v_proj/down_proj
// (also v_a_proj/v_b_proj) in "more bits" layers: the first and last eighth of the layers and every third layer
// in between (index < n/8, index >= 7n/8, or (index - n/8) % 3 == 2; integer divisions).
enum class AffineRecipe { None, Mixed_2_6, Mixed_3_4, Mixed_3_6, Mixed_4_6 };
AffineRecipe parse_affine_recipe(std::string_view name);  // "" -> None; fails listing the recipes for others
std::string_view affine_recipe_name(AffineRecipe r);
struct RecipeBits {
  int low = 0, high = 0;
};
RecipeBits affine_recipe_bits(AffineRecipe r);

// The recipe's choice for one module path. `layer_location` is the position of the layer index among the
// path's dot-separated parts (found on the first down_proj path, as mlx-lm does); a path with no part there
// counts as layer 0. Fails naming the path when that part is not a number.
AffineParams affine_recipe_params(AffineRecipe r, std::string_view module_path, int layer_location, int num_layers,
                                  int group_size);

struct AffineConvertOptions {
  std::string in_dir, out_dir;
  AffineParams params;  // the default bits and group size (--bits, --group-size)
  AffineRecipe recipe = AffineRecipe::None;
  // The tensors to write, in order, with the shapes the model expects (the caller's model description). Every
  // one must be in the checkpoint with that shape; checkpoint tensors not listed are left out (as mlx-lm's
  // sanitize drops what the model does not use).
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Tensor> tensors;
  int num_layers = 0;                      // for the recipes
  uint64_t shard_bytes = uint64_t(5) << 30;  // mlx-lm's MAX_FILE_SIZE_GB
  // Trellis instead of affine (formats.md §3): matrices the recipe codes are encoded by the CPU Viterbi
  // (trellis_encode_linear, rows over the pool; f32 of the source values) into .weight U32 and .scales F16;
  // the rest as in the affine path (dense, cast). `params` and `recipe` are then unused.
  std::optional<TrellisRecipe> trellis;
  TrellisEncodeOptions encode;
  // Trellis with LDLQ (quant/trellis_ldlq.h; `arbor quantize --calib`): a module path's input Hessian E[x xᵀ]
  // [in, in], or null to code that module without it.
  std::function<const std::vector<double>*(const std::string& module)> input_hessian;
  LdlqOptions ldlq;
};

struct AffineConvertStats {
  uint64_t tensors_written = 0, modules_quantized = 0, bytes_in = 0, bytes_out = 0, shards = 0;
  std::vector<std::string> left_dense;  // matrices left dense, each with the reason
  std::vector<std::string> dropped;     // checkpoint tensors not written
  std::vector<std::string> copied_files;
  uint64_t modules_ldlq = 0;     // trellis: modules coded with their input Hessian
  uint64_t weights_encoded = 0;  // trellis: weights through the Viterbi, and the seconds it took
  double encode_seconds = 0;
};

// Quantizes in_dir into out_dir (created; it must not exist or be empty). A tensor is quantized when its name
// ends in ".weight", it is 2-D F32/F16/BF16 (a Linear or an Embedding: the modules MLX's nn.quantize converts),
// and its rows divide into groups of params.group_size; other matrices stay dense (listed in left_dense).
// Float tensors are cast to the config's torch_dtype (else text_config.dtype) when that is float16, bfloat16 or
// float32, as mlx_lm.convert does; scales and biases take the same dtype. progress(bytes) after each input
// tensor. Errors name the tensor: a missing one, a shape other than expected, a non-finite value.
AffineConvertStats affine_convert_checkpoint(const AffineConvertOptions& o, const std::function<void(uint64_t)>& progress,
                                             ThreadPool* pool = nullptr);

// The tokenizer and generation files copied next to the weights when present.
extern const char* const kAffineConvertCopiedFiles[];

}  // namespace arbor::quant
