// Writing trellis checkpoints (formats.md §3): which modules are coded and how (the recipe: bits, axis,
// --k-map), the config.json entries, and synthetic trellis matrices (random code words, which are all
// valid codes, with plausible scales) for `arbor synth --format trellis`. The dense -> trellis
// conversion itself is affine_convert_checkpoint with AffineConvertOptions::trellis set.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/json.h"
#include "quant/trellis.h"

namespace arbor {
class ThreadPool;
}

namespace arbor::quant {

// Issue 20's defaults: every linear of the layers coded at `bits`, along the inputs (axis 1) except the
// down projection (`down_axis`, default 0: stored transposed, coded along the outputs); the embedding and
// an untied head stay dense (`dense`). k_map overrides the bits per module: a key matches a module path
// equal to it or ending in "." + key ("down_proj=4" for every layer's down projection).
struct TrellisRecipe {
  int bits = 2;
  int down_axis = 0;
  int axis = 1;  // every other linear (`arbor quantize --axis`): 0 lets LDLQ feed each input's error forward
  std::string down_suffix = "mlp.down_proj";  // the architecture's down projection (ArchDescriptor::names.down)
  std::vector<std::pair<std::string, int>> k_map;
  std::set<std::string> dense;  // module paths kept dense
  std::vector<std::string> fused;  // matrices the loader splits by rows (qkv_proj, gate_up_proj; matched as k_map keys): axis 1
};
// `module` is `key`, or ends in "." + key (how --k-map keys and the recipe's suffixes name modules).
bool module_matches(std::string_view module, std::string_view key);
// "down_proj=4,q_proj=3" -> pairs; fails naming the bad item (no '=', k not 2/3/4).
std::vector<std::pair<std::string, int>> parse_trellis_k_map(std::string_view spec);
// Fails unless bits and every k_map entry are 2, 3 or 4 and down_axis and axis are 0 or 1 (`what` starts the message).
void check_trellis_recipe(const TrellisRecipe& r, std::string_view what);

// The config of matrix `module` ([out, in] as the model holds it), or nullopt with the reason in *why (kept
// dense by the recipe, or the coded length not a multiple of 256).
std::optional<TrellisConfig> trellis_recipe_config(const TrellisRecipe& r, const std::string& module, int64_t out, int64_t in,
                                                   std::string* why = nullptr);

// The quantization block written for a trellis checkpoint: the default entry (recipe bits, axis 1) at the top
// and an entry for every coded module (parse_affine_quant_config reads it back).
json trellis_quant_block(int default_bits, const std::vector<std::pair<std::string, TrellisConfig>>& modules);

// Stored shapes of a coded matrix [out, in]: weight [coded rows, coded cols*k/32] and scales [coded rows].
std::vector<int64_t> trellis_weight_shape(const TrellisConfig& c, int64_t out, int64_t in);
std::vector<int64_t> trellis_scales_shape(const TrellisConfig& c, int64_t out, int64_t in);

// Synthetic values of one coded matrix, seeded by its ".weight" tensor name: every word uniform (a random
// bit stream is a valid code), f16 scales that give the decoded weights about the dense dummy weights'
// spread (RMS 1/sqrt(3*in), i.e. U(-1/sqrt(in), 1/sqrt(in))), varying by up to 10% between rows. Fills
// whichever of words / scales is non-null; the same name always gives the same values.
void trellis_synth_matrix(const std::string& weight_name, const TrellisConfig& c, int64_t out, int64_t in, uint32_t* words,
                          uint16_t* scales_f16, ThreadPool* pool = nullptr);

struct TrellisSynthStats {
  uint64_t tensors = 0, modules_coded = 0, bytes = 0, shards = 0;
};
struct TrellisSynthTensor {
  std::string name;
  std::vector<int64_t> shape;
};
// Writes out_dir/config.json (config_json with `quantization` and `quantization_config` =
// trellis_quant_block) and the weights: each ".weight" matrix the recipe codes as trellis_synth_matrix
// makes it; every other tensor from fill_dense(tensor, out) in `dtype`. progress(bytes) as it goes.
TrellisSynthStats write_trellis_synthetic_checkpoint(const json& config_json, const std::vector<TrellisSynthTensor>& tensors,
                                                     const std::string& out_dir, DType dtype, const TrellisRecipe& recipe,
                                                     uint64_t shard_bytes,
                                                     const std::function<void(const TrellisSynthTensor&, void*)>& fill_dense,
                                                     const std::function<void(uint64_t)>& progress = nullptr, ThreadPool* pool = nullptr);

}  // namespace arbor::quant
