// `arbor synth --config FILE --out DIR [--dtype bf16] [--bits B --group-size G] [--format trellis]`: a
// deterministic random checkpoint, dense, MLX affine quantized, or trellis-coded.
#include <cstdio>

#include "cli/args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "model/archs.h"
#include "model/synth.h"
#include "model/weights.h"
#include "quant/affine_synth.h"
#include "quant/trellis_convert.h"

namespace arbor::cli {
namespace {

int cmd_synth(const std::vector<std::string>& args) {
  Args a(args, {"config", "out", "dtype", "shard-gb", "bits", "group-size", "format", "down-axis", "axis"}, {});
  auto cfg = a.get("config");
  auto out = a.get("out");
  if (!cfg || !out) fail("arguments: usage: arbor synth --config FILE --out DIR [--dtype bf16|f16|f32] [--shard-gb 4] [--bits B --group-size G]");
  std::string d = a.get_or("dtype", "bf16");
  DType dt = d == "bf16" ? DType::BF16 : d == "f16" ? DType::F16 : d == "f32" ? DType::F32 : DType::U8;
  if (dt == DType::U8) fail("arguments: --dtype must be bf16, f16 or f32, got '{}'", d);
  double shard_gb = a.get_double("shard-gb", 4.0);
  json j = read_json_file(*cfg);
  const std::string format = a.get_or("format", a.has("bits") || a.has("group-size") ? "affine" : "dense");
  if (format != "dense" && format != "affine" && format != "trellis") fail("arguments: --format must be dense, affine or trellis, got '{}'", format);
  if (format == "trellis") {  // random trellis code words (every bit stream is a valid code) and scales
    if (a.has("group-size")) fail("arguments: --group-size is for affine weights (trellis blocks are 256)");
    ModelConfig c = parse_model_config(j, "synth config");
    const ArchDescriptor& arch = find_arch(c);
    apply_arch_defaults(c, arch);
    const quant::TrellisRecipe r =
        trellis_arch_recipe(arch, int(a.get_int("bits", 2)), int(a.get_int("down-axis", 0)), int(a.get_int("axis", 1)));
    quant::check_trellis_recipe(r, "arguments: --bits/--down-axis/--axis");
    std::vector<quant::TrellisSynthTensor> ts;
    for (const TensorSpec& s : expected_tensors(c, arch)) ts.push_back({s.name, s.shape});
    ThreadPool pool(0);
    Progress prog("writing weights", 0);
    const quant::TrellisSynthStats st = quant::write_trellis_synthetic_checkpoint(
        j, ts, *out, dt, r, uint64_t(shard_gb * 1e9),
        [&](const quant::TrellisSynthTensor& t, void* dst) { fill_dummy(TensorSpec{t.name, t.shape}, arch, dt, dst, &pool); },
        [&](uint64_t n) { prog.advance(n); }, &pool);
    prog.finish();
    std::printf("wrote %s: %llu tensors (%llu modules trellis %d-bit, down axis %d), %.3f GB in %llu shard(s)\n", out->c_str(),
                (unsigned long long)st.tensors, (unsigned long long)st.modules_coded, r.bits, r.down_axis, double(st.bytes) * 1e-9,
                (unsigned long long)st.shards);
    return 0;
  }
  for (const char* f : {"down-axis", "axis"})
    if (a.has(f)) fail("arguments: --{} is for --format trellis", f);
  if (format == "affine") {  // random MLX affine weights
    const quant::AffineParams p{int(a.get_int("group-size", 64)), int(a.get_int("bits", 4))};
    quant::check_affine_params(p, "arguments: --bits/--group-size");
    ModelConfig c = parse_model_config(j, "synth config");
    const ArchDescriptor& arch = find_arch(c);
    apply_arch_defaults(c, arch);
    std::vector<quant::SynthTensor> ts;
    for (const TensorSpec& s : expected_tensors(c, arch)) ts.push_back({s.name, s.shape});
    ThreadPool pool(0);
    Progress prog("writing weights", 0);
    const quant::AffineSynthStats st = quant::write_affine_synthetic_checkpoint(
        j, ts, *out, dt, p, uint64_t(shard_gb * 1e9),
        [&](const quant::SynthTensor& t, void* dst) { fill_dummy(TensorSpec{t.name, t.shape}, arch, dt, dst, &pool); },
        [&](uint64_t n) { prog.advance(n); }, &pool);
    prog.finish();
    std::printf("wrote %s: %llu tensors (%llu modules %d-bit, group %d), %.3f GB in %llu shard(s)\n", out->c_str(),
                (unsigned long long)st.tensors, (unsigned long long)st.modules_quantized, p.bits, p.group_size,
                double(st.bytes) * 1e-9, (unsigned long long)st.shards);
    return 0;
  }
  Progress prog("writing weights", 0);
  SynthStats st = write_synthetic_checkpoint(j, *out, dt, uint64_t(shard_gb * 1e9), [&](uint64_t n) { prog.advance(n); });
  prog.finish();
  std::printf("wrote %s: %llu tensors, %.3f GB in %llu shard(s)\n", out->c_str(), (unsigned long long)st.tensors,
              double(st.bytes) * 1e-9, (unsigned long long)st.shards);
  return 0;
}

ARBOR_VERB("synth", "write a deterministic random checkpoint for a config (--config FILE --out DIR)", "--config FILE --out DIR [flags]",
           "  --config FILE         the model's config.json (copied into DIR)\n"
           "  --out DIR             where the safetensors shards go\n"
           "  --dtype bf16|f16|f32  weight type (default bf16)\n"
           "  --shard-gb G          largest shard (default 4)\n"
           "  --bits B              MLX affine weights: random codes of B bits (2, 3, 4, 5, 6, 8) for every\n"
           "                        matrix whose rows divide into groups, scales/biases in --dtype\n"
           "  --group-size G        their group size (32, 64, 128; default 64)\n"
           "  --format F            dense, affine (the default with --bits) or trellis: random trellis code words\n"
           "                        (k = --bits: 2, 3, 4; default 2) and f16 row scales for the layers' linears\n"
           "  --down-axis 0|1       trellis: the down projection's axis (default 0)\n"
           "  --axis 0|1            trellis: the other linears' axis (default 1; fused q/k/v, gate/up stay on 1)\n",
           cmd_synth);

}  // namespace
}  // namespace arbor::cli
