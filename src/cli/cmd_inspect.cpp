// `arbor inspect DIR`: architecture, parameters, dtypes, weight bytes and KV bytes per token.
#include <cstdio>
#include <map>
#include <optional>

#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "model/archs.h"
#include "model/weights.h"
#include "quant/affine.h"

namespace arbor::cli {
namespace {

int cmd_inspect(const std::vector<std::string>& args) {
  Args a(args, {"config"}, {});
  std::string dir = a.positional().empty() ? "" : resolve_model_dir(a.positional()[0]);
  std::string cfg_path = a.get_or("config", dir.empty() ? "" : dir + "/config.json");
  if (cfg_path.empty()) fail("arguments: usage: arbor inspect DIR");
  ModelConfig c = load_model_config(cfg_path);
  const ArchDescriptor& arch = find_arch(c);
  apply_arch_defaults(c, arch);
  uint64_t params = 0, bytes = 0;
  std::map<std::string, uint64_t> by_dtype;
  // MLX affine modules (a module is quantized when its .scales is stored), by kind (the path's last part).
  struct KindStats {
    std::map<std::string, int> params;  // "4-bit g64" -> modules
    uint64_t bytes = 0;
  };
  std::map<std::string, KindStats> quantized, trellis;  // trellis modules: .weight and .scales, the config's trellis entry
  const std::optional<quant::AffineQuantConfig> qc = quant::parse_affine_quant_config(read_json_file(cfg_path), cfg_path);
  bool have_ckpt = !dir.empty() && (file_exists(dir + "/model.safetensors") || file_exists(dir + "/model.safetensors.index.json"));
  if (have_ckpt) {
    Checkpoint ck = Checkpoint::open(dir);
    for (const TensorInfo* t : ck.tensors()) {
      params += uint64_t(t->numel());
      bytes += t->nbytes;
      by_dtype[std::string(dtype_name(t->dtype))] += t->nbytes;
      const std::string& n = t->name;
      if (!qc || n.size() <= 7 || n.compare(n.size() - 7, 7, ".scales") != 0) continue;
      const std::string module = n.substr(0, n.size() - 7);
      if (const std::optional<quant::TrellisConfig> tc = qc->trellis_for(module)) {
        KindStats& k = trellis[module.substr(module.rfind('.') + 1)];
        k.params[fmt::format("{}-bit axis {}", tc->bits, tc->axis)]++;
        for (const char* part : {".weight", ".scales"})
          if (const TensorInfo* ti = ck.find(module + part)) k.bytes += ti->nbytes;
        continue;
      }
      const std::optional<quant::AffineParams> p = qc->for_module(module);
      KindStats& k = quantized[module.substr(module.rfind('.') + 1)];
      k.params[p ? fmt::format("{}-bit g{}", p->bits, p->group_size) : "dense in config.json"]++;
      for (const char* part : {".weight", ".scales", ".biases"})
        if (const TensorInfo* ti = ck.find(module + part)) k.bytes += ti->nbytes;
    }
  } else {
    for (const auto& s : expected_tensors(c, arch)) {
      uint64_t n = 1;
      for (auto d : s.shape) n *= uint64_t(d);
      params += n;
    }
    bytes = params * 2;
    by_dtype["BF16 (no checkpoint; assumed)"] = bytes;
  }
  std::printf("architecture   %s (%s)\n", arch.model_type.c_str(), c.architecture.empty() ? "-" : c.architecture.c_str());
  std::printf("config         %s\n", c.summary().c_str());
  std::printf("parameters     %llu (%.3f B)\n", (unsigned long long)params, double(params) * 1e-9);
  for (auto& [dt, b] : by_dtype) std::printf("dtype          %s: %.3f GB\n", dt.c_str(), double(b) * 1e-9);
  std::printf("weight bytes   %llu (%.3f GB)\n", (unsigned long long)bytes, double(bytes) * 1e-9);
  for (const auto& [kind, k] : quantized) {
    std::string what;
    for (const auto& [p, n] : k.params) what += fmt::format("{}{} x{}", what.empty() ? "" : ", ", p, n);
    std::printf("affine         %s: %s, %llu bytes (%.3f GB)\n", kind.c_str(), what.c_str(), (unsigned long long)k.bytes,
                double(k.bytes) * 1e-9);
  }
  for (const auto& [kind, k] : trellis) {
    std::string what;
    for (const auto& [p, m] : k.params) what += fmt::format("{}{} x{}", what.empty() ? "" : ", ", p, m);
    std::printf("trellis        %s: %s, %llu bytes (%.3f GB)\n", kind.c_str(), what.c_str(), (unsigned long long)k.bytes,
                double(k.bytes) * 1e-9);
  }
  int64_t kv_f32 = 2 * c.n_layers * c.kv_dim() * 4, kv_bf16 = kv_f32 / 2;
  std::printf("kv per token   %lld bytes f32 (CPU), %lld bytes bf16 (CUDA)\n", (long long)kv_f32, (long long)kv_bf16);
  std::printf("kv codecs      bytes per token: %s (--kv-cache; bf16 as on CUDA)\n",
              kv_bytes_per_codec(c.n_layers, c.n_kv_heads, c.head_dim, 2).c_str());
  std::printf("context        %lld positions; sliding window %lld\n", (long long)c.max_position, (long long)c.sliding_window);
  return 0;
}

ARBOR_VERB("inspect", "describe a checkpoint: architecture, parameters, dtypes, bytes, KV per token", "DIR [--config FILE]",
           "  --config FILE         describe this config.json (without DIR: the config alone, no tensors)\n", cmd_inspect);

}  // namespace
}  // namespace arbor::cli
