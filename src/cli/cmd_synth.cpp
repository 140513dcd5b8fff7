// `arbor synth --config FILE --out DIR [--dtype bf16]`: a deterministic random checkpoint.
#include <cstdio>

#include "cli/args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/log.h"
#include "model/synth.h"

namespace arbor::cli {
namespace {

int cmd_synth(const std::vector<std::string>& args) {
  Args a(args, {"config", "out", "dtype", "shard-gb"}, {});
  auto cfg = a.get("config");
  auto out = a.get("out");
  if (!cfg || !out) fail("arguments: usage: arbor synth --config FILE --out DIR [--dtype bf16|f16|f32] [--shard-gb 4]");
  std::string d = a.get_or("dtype", "bf16");
  DType dt = d == "bf16" ? DType::BF16 : d == "f16" ? DType::F16 : d == "f32" ? DType::F32 : DType::U8;
  if (dt == DType::U8) fail("arguments: --dtype must be bf16, f16 or f32, got '{}'", d);
  double shard_gb = a.get_double("shard-gb", 4.0);
  json j = read_json_file(*cfg);
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
           "  --shard-gb G          largest shard (default 4)\n",
           cmd_synth);

}  // namespace
}  // namespace arbor::cli
