// Synthetic checkpoint writer.
#include "model/synth.h"

#include <filesystem>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/archs.h"
#include "model/weights.h"

namespace arbor {

SynthStats write_synthetic_checkpoint(const json& config_json, const std::string& out_dir, DType dtype, uint64_t shard_bytes,
                                      const std::function<void(uint64_t)>& progress) {
  ModelConfig c = parse_model_config(config_json, "synth config");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  std::filesystem::create_directories(out_dir);
  {
    std::ofstream f(out_dir + "/config.json");
    f << config_json.dump(2) << "\n";
    if (!f) fail("synth: cannot write {}/config.json", out_dir);
  }
  std::vector<TensorSpec> specs = expected_tensors(c, a);
  // Group tensors into shards of at most shard_bytes (a tensor larger than that gets its own shard).
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  auto bytes_of = [&](const TensorSpec& s) {
    uint64_t n = dtype_size(dtype);
    for (auto d : s.shape) n *= uint64_t(d);
    return n;
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    uint64_t b = bytes_of(specs[i]);
    if (!shards.back().empty() && in_shard + b > shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(i);
    in_shard += b;
  }
  SynthStats st;
  json weight_map = json::object();
  ThreadPool pool(0);  // all cores fill the tensors
  for (size_t si = 0; si < shards.size(); ++si) {
    std::string file = shards.size() == 1 ? "model.safetensors"
                                          : fmt::format("model-{:05d}-of-{:05d}.safetensors", si + 1, shards.size());
    std::vector<std::unique_ptr<uint8_t[]>> data;
    std::vector<TensorToWrite> out;
    for (size_t i : shards[si]) {
      uint64_t b = bytes_of(specs[i]);
      data.emplace_back(new uint8_t[b]);
      fill_dummy(specs[i], a, dtype, data.back().get(), &pool);
      out.push_back({specs[i].name, dtype, specs[i].shape, data.back().get(), size_t(b)});
      weight_map[specs[i].name] = file;
      st.tensors++, st.bytes += b;
      if (progress) progress(b);
    }
    write_safetensors(out_dir + "/" + file, out, json{{"format", "pt"}});
    st.shards++;
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", st.bytes}}}, {"weight_map", weight_map}};
    std::ofstream f(out_dir + "/model.safetensors.index.json");
    f << index.dump(2) << "\n";
  }
  return st;
}

quant::TrellisRecipe trellis_arch_recipe(const ArchDescriptor& a, int bits, int down_axis, int axis) {
  quant::TrellisRecipe r;
  r.bits = bits;
  r.down_axis = down_axis;
  r.axis = axis;
  r.down_suffix = a.names.down;
  for (const std::string& f : {a.names.qkv, a.names.gate_up})
    if (!f.empty()) r.fused.push_back(f);
  for (const std::string& t : {a.names.embed, a.names.lm_head})
    if (t.size() > 7) r.dense.insert(t.substr(0, t.size() - 7));
  return r;
}

}  // namespace arbor
