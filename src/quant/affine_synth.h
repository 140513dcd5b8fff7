// Synthetic MLX affine checkpoints for benchmarks and tests: random codes with plausible scales and biases for
// every matrix mlx-lm would quantize, dense tensors from the caller's filler, streamed shard by shard.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/json.h"
#include "quant/affine.h"

namespace arbor {
class ThreadPool;
}

namespace arbor::quant {

struct AffineSynthStats {
  uint64_t tensors = 0, modules_quantized = 0, bytes = 0, shards = 0;
};

struct SynthTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Whether synth (and --dummy-weights) quantize a matrix with rows of `cols` values: as mlx-lm's default
// predicate, every Linear and Embedding whose rows divide into groups of p.group_size.
bool affine_synth_quantizes(int64_t cols, const AffineParams& p);

// The synthetic values of one quantized matrix, seeded by its ".weight" tensor's name: codes uniform over the
// 2^bits levels; per group a scale and bias that spread the group over about [-h, h], h = 1/sqrt(cols) (the
// dense dummy weights' range), varying by up to 10% between groups. Fills whichever of codes
// ([rows, words_per_row]) and scales, biases ([rows, groups_per_row], in `dtype`: F32, F16 or BF16) is non-null;
// the same name always gives the same values, so the three may be made in separate calls.
void affine_synth_matrix(const std::string& weight_name, const AffineShape& s, DType dtype, uint32_t* codes, void* scales,
                         void* biases, ThreadPool* pool = nullptr);

// Writes out_dir/config.json (config_json with `quantization` and `quantization_config` = {group_size, bits,
// mode "affine"}) and the weights: each ".weight" matrix whose rows divide into groups of p.group_size (the rule
// arbor quantize follows) as affine_synth_matrix makes it, scales and biases in `dtype`; every other tensor
// from fill_dense(tensor, out) in `dtype`. Deterministic: seeded by the tensor names. progress(bytes) as it goes.
AffineSynthStats write_affine_synthetic_checkpoint(
    const json& config_json, const std::vector<SynthTensor>& tensors, const std::string& out_dir, DType dtype,
    const AffineParams& p, uint64_t shard_bytes, const std::function<void(const SynthTensor&, void*)>& fill_dense,
    const std::function<void(uint64_t)>& progress = nullptr, ThreadPool* pool = nullptr);

}  // namespace arbor::quant
