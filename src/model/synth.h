// Synthetic checkpoints: a config.json plus deterministic random weights written as safetensors in
// the Hugging Face layout (sharded with an index past shard_bytes), for load benchmarks and tests.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "core/dtype.h"
#include "core/json.h"
#include "quant/trellis_convert.h"

namespace arbor {

struct ArchDescriptor;

struct SynthStats {
  uint64_t tensors = 0, bytes = 0, shards = 0;
};

// Writes out_dir/config.json (config_json as given) and the weights. progress(bytes) as it goes.
SynthStats write_synthetic_checkpoint(const json& config_json, const std::string& out_dir, DType dtype,
                                      uint64_t shard_bytes = uint64_t(4) << 30,
                                      const std::function<void(uint64_t)>& progress = nullptr);

// The trellis recipe of an architecture (`arbor quantize --format trellis` adds its --k-map; `arbor synth
// --format trellis` and --dummy-weights --format trellis use it as it is): the layers' linears at `bits`, the architecture's down projection on `down_axis`, the rest on `axis`
// (fused q/k/v and gate/up matrices always on axis 1), the embedding and the head dense.
quant::TrellisRecipe trellis_arch_recipe(const ArchDescriptor& a, int bits, int down_axis, int axis = 1);

}  // namespace arbor
