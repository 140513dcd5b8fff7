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
#include "quant/affine_synth.h"

namespace arbor::cli {
namespace {

int cmd_inspect(const std::vector<std::string>& args) {
  Args a(args, {"config", "bits", "group-size"}, {});
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
  // Parameters are the model's weights (a quantized matrix: rows x cols, not its packed words).
  for (const auto& s : expected_tensors(c, arch)) {
    uint64_t n = 1;
    for (auto d : s.shape) n *= uint64_t(d);
    params += n;
  }
  if (have_ckpt && (a.has("bits") || a.has("group-size"))) fail("arguments: --bits/--group-size describe a config without a checkpoint");
  if (have_ckpt) {
    Checkpoint ck = Checkpoint::open(dir);
    for (const TensorInfo* t : ck.tensors()) {
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
  } else if (a.has("bits") || a.has("group-size")) {
    // What --dummy-weights --bits B --group-size G (or arbor synth --bits) holds: MLX affine matrices where the
    // rows divide into groups (codes U32, scales and biases bf16), every other tensor bf16.
    const DummyQuant dq = dummy_quant_from_args(a, true);
    const quant::AffineParams& p = dq.affine;
    for (const auto& s : expected_tensors(c, arch)) {
      const bool affine = s.shape.size() == 2 && quant::affine_synth_quantizes(s.shape[1], p);
      if (!affine) {
        const uint64_t b = uint64_t(s.shape[0]) * uint64_t(s.shape.size() == 2 ? s.shape[1] : 1) * 2;
        by_dtype["BF16 (no checkpoint; --dtype bf16 assumed)"] += b, bytes += b;
        continue;
      }
      const quant::AffineShape sh{s.shape[0], s.shape[1], p};
      const uint64_t codes = uint64_t(sh.rows * sh.words_per_row()) * 4, sb = uint64_t(sh.rows * sh.groups_per_row()) * 2 * 2;
      by_dtype["U32 (no checkpoint; affine codes)"] += codes;
      by_dtype["BF16 (no checkpoint; --dtype bf16 assumed)"] += sb;
      bytes += codes + sb;
      const std::string module = s.name.substr(0, s.name.size() - 7);
      KindStats& k = quantized[module.substr(module.rfind('.') + 1)];
      k.params[dq.describe().substr(7)]++;  // "4-bit g64"
      k.bytes += codes + sb;
    }
  } else {
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
           "  --config FILE         describe this config.json (without DIR: the config alone, no tensors)\n"
           "  --bits B              without a checkpoint: bytes as --dummy-weights --bits B (MLX affine) holds them\n"
           "  --group-size G        their group size (32, 64, 128; default 64)\n",
           cmd_inspect);

}  // namespace
}  // namespace arbor::cli
