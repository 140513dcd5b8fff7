// `arbor quantize --model IN --out OUT --bits B --group-size G [--recipe R]`: a dense checkpoint written as an MLX
// affine one (quant/affine_convert.h), one tensor at a time.
#include <cstdio>

#include "cli/args.h"
#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/archs.h"
#include "model/config.h"
#include "model/weights.h"
#include "quant/affine_convert.h"

namespace arbor::cli {
namespace {

int cmd_quantize(const std::vector<std::string>& args) {
  Args a(args, {"model", "out", "bits", "group-size", "recipe", "shard-gb", "threads"}, {});
  auto model = a.get("model");
  auto out = a.get("out");
  if (!model || !out)
    fail("arguments: usage: arbor quantize --model IN --out OUT [--bits 4] [--group-size 64] "
         "[--recipe mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6]");
  quant::AffineConvertOptions o;
  o.in_dir = resolve_model_dir(*model);
  o.out_dir = *out;
  o.params.bits = int(a.get_int("bits", 4));
  o.params.group_size = int(a.get_int("group-size", 64));
  quant::check_affine_params(o.params, "arguments: --bits/--group-size");
  o.recipe = quant::parse_affine_recipe(a.get_or("recipe", ""));
  const double shard_gb = a.get_double("shard-gb", 5.0);
  if (!(shard_gb > 0)) fail("arguments: --shard-gb must be positive, got {}", shard_gb);
  o.shard_bytes = uint64_t(shard_gb * double(uint64_t(1) << 30));

  // The tensors a model of this config has, as arbor loads it: the architecture must be one arbor knows.
  ModelConfig c = load_model_config(o.in_dir + "/config.json");
  const ArchDescriptor& arch = find_arch(c);
  apply_arch_defaults(c, arch);
  for (const TensorSpec& s : expected_tensors(c, arch)) o.tensors.push_back({s.name, s.shape});
  o.num_layers = int(c.n_layers);

  ThreadPool pool(int(a.get_int("threads", 0)));
  uint64_t total = 0;
  {
    const Checkpoint ck = Checkpoint::open(o.in_dir);
    for (const auto& t : o.tensors)
      if (const TensorInfo* i = ck.find(t.name)) total += i->nbytes;
  }
  Progress prog("quantizing", total);
  const quant::AffineConvertStats st = quant::affine_convert_checkpoint(o, [&](uint64_t n) { prog.advance(n); }, &pool);
  prog.finish();
  for (const auto& s : st.left_dense) std::printf("left dense: %s\n", s.c_str());
  if (!st.dropped.empty()) {
    std::printf("left out (not used by the model):");
    for (const auto& s : st.dropped) std::printf(" %s", s.c_str());
    std::printf("\n");
  }
  std::printf("wrote %s: %llu modules quantized (%d-bit, group %d%s%s), %llu tensors, %.3f GB -> %.3f GB in %llu shard(s); "
              "copied %zu tokenizer/config file(s)\n",
              out->c_str(), (unsigned long long)st.modules_quantized, o.params.bits, o.params.group_size,
              o.recipe == quant::AffineRecipe::None ? "" : ", recipe ",
              std::string(quant::affine_recipe_name(o.recipe)).c_str(), (unsigned long long)st.tensors_written,
              double(st.bytes_in) * 1e-9, double(st.bytes_out) * 1e-9, (unsigned long long)st.shards,
              st.copied_files.size());
  return 0;
}

ARBOR_VERB("quantize", "write a dense checkpoint as an MLX affine quantized one (--model IN --out OUT --bits 4 --group-size 64)",
           "--model IN --out OUT [flags]",
           "  --model DIR           the dense checkpoint (a directory, or a repo id in the Hugging Face cache)\n"
           "  --out DIR             where the quantized checkpoint goes (must not exist, or be empty)\n"
           "  --bits B              2, 3, 4, 5, 6 or 8 (default 4)\n"
           "  --group-size G        32, 64 or 128 (default 64)\n"
           "  --recipe R            mlx-lm's mixed recipes: mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6 (low bits,\n"
           "                        high bits for lm_head and v_proj/down_proj in some layers)\n"
           "  --shard-gb G          largest shard in GiB (default 5, as mlx-lm)\n"
           "  --threads N           threads that quantize rows (default: every CPU)\n",
           cmd_quantize);

}  // namespace
}  // namespace arbor::cli
