// `arbor quantize --model IN --out OUT --bits B --group-size G [--recipe R]`: a dense checkpoint written as an MLX
// affine one (quant/affine_convert.h), one tensor at a time; `--format trellis --bits k [--down-axis 0|1]
// [--k-map module=k,...] [--encoder auto|cpu|cuda]`: trellis-coded instead (quant/trellis_convert.h, the Viterbi of
// trellis_encode.h on the CPU, or cuda_trellis_viterbi on the GPU when there is one); with `--calib TEXT`, each
// linear coded against its input Hessian from the dense model run over TEXT (LDLQ: engine/calibration.h,
// quant/trellis_ldlq.h).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "cli/args.h"
#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/calibration.h"
#include "io/checkpoint.h"
#include "model/archs.h"
#include "model/config.h"
#include "model/rotate.h"
#include "model/synth.h"
#include "model/weights.h"
#include "quant/affine_convert.h"
#include "text/tokenizer/tokenizer.h"
#ifdef ARBOR_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/trellis.h"
#endif

namespace arbor::cli {
namespace {

int cmd_quantize(const std::vector<std::string>& args) {
  Args a(args, {"model", "out", "bits", "group-size", "recipe", "shard-gb", "threads", "format", "down-axis", "axis", "k-map", "encoder",
                          "calib", "calib-tokens", "calib-ctx", "calib-layers", "damp", "rotate-seed"},
         {"rotate"});
  auto model = a.get("model");
  auto out = a.get("out");
  if (!model || !out)
    fail("arguments: usage: arbor quantize --model IN --out OUT [--bits 4] [--group-size 64] "
         "[--recipe mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6]");
  quant::AffineConvertOptions o;
  o.in_dir = resolve_model_dir(*model);
  o.out_dir = *out;
  const std::string format = a.get_or("format", "affine");
  if (format != "affine" && format != "trellis") fail("arguments: --format must be affine or trellis, got '{}'", format);
  const bool trellis = format == "trellis";
  if (trellis) {
    for (const char* f : {"group-size", "recipe"})
      if (a.has(f)) fail("arguments: --{} is for --format affine (trellis blocks are 256 weights; use --k-map for mixed bits)", f);
  } else {
    for (const char* f : {"down-axis", "axis", "k-map", "encoder", "calib", "calib-tokens", "calib-ctx", "calib-layers", "damp"})
      if (a.has(f)) fail("arguments: --{} is for --format trellis", f);
  }
  // The Viterbi runs on the GPU when there is one (the same paths as the CPU's, bit for bit: CudaTrellisEncode.*,
  // checked on an H100 in session 21), else on the CPU's threads; --encoder picks one.
  const std::string encoder = a.get_or("encoder", "auto");
  if (encoder != "auto" && encoder != "cpu" && encoder != "cuda") fail("arguments: --encoder must be auto, cpu or cuda, got '{}'", encoder);
  if (trellis && encoder != "cpu") {
#ifdef ARBOR_HAS_CUDA
    std::string why;
    if (cuda_device_available(&why)) o.encode.block_viterbi = cuda::cuda_trellis_viterbi;
    else if (encoder == "cuda") fail("arguments: --encoder cuda: {}", why);
#else
    if (encoder == "cuda") fail("arguments: --encoder cuda: this arbor was built without CUDA");
#endif
  }
  o.params.bits = int(a.get_int("bits", trellis ? 2 : 4));
  o.params.group_size = int(a.get_int("group-size", 64));
  if (!trellis) quant::check_affine_params(o.params, "arguments: --bits/--group-size");
  o.recipe = quant::parse_affine_recipe(a.get_or("recipe", ""));
  const double shard_gb = a.get_double("shard-gb", 5.0);
  if (!(shard_gb > 0)) fail("arguments: --shard-gb must be positive, got {}", shard_gb);
  o.shard_bytes = uint64_t(shard_gb * double(uint64_t(1) << 30));

  // --rotate: the residual stream rotated first (model/rotate.h), into a dense f32 checkpoint beside OUT that
  // calibration and quantization then read; removed at the end, whatever happens.
  if (a.has("rotate-seed") && !a.has("rotate")) fail("arguments: --rotate-seed goes with --rotate");
  std::string rotated;
  struct RemoveDir {
    const std::string& dir;
    ~RemoveDir() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } remove_rotated{rotated};
  if (a.has("rotate")) {
    std::filesystem::path op = std::filesystem::path(*out).lexically_normal();
    if (!op.has_filename()) op = op.parent_path();  // "OUT/" -> "OUT"
    rotated = op.string() + ".rotating";
    std::filesystem::remove_all(rotated);
    uint64_t bytes = 0;
    for (const TensorInfo* t : Checkpoint::open(o.in_dir).tensors()) bytes += t->nbytes;
    Progress rp("rotating", bytes);
    const RotateStats rs = rotate_residual_checkpoint(o.in_dir, rotated, uint64_t(a.get_int("rotate-seed", 0)),
                                                      [&](uint64_t n) { rp.advance(n); });
    rp.finish();
    std::printf("rotated the residual stream (random Hadamard, seed %lld): %lld tensors%s\n", (long long)a.get_int("rotate-seed", 0),
                (long long)rs.tensors, rs.untied ? "; the tied embedding untied (the head carries the final norm)" : "");
    o.in_dir = rotated;
  }

  // The tensors a model of this config has, as arbor loads it: the architecture must be one arbor knows.
  ModelConfig c = load_model_config(o.in_dir + "/config.json");
  const ArchDescriptor& arch = find_arch(c);
  apply_arch_defaults(c, arch);
  for (const TensorSpec& s : expected_tensors(c, arch)) o.tensors.push_back({s.name, s.shape});
  o.num_layers = int(c.n_layers);
  if (trellis) {
    quant::TrellisRecipe r = trellis_arch_recipe(arch, o.params.bits, int(a.get_int("down-axis", 0)), int(a.get_int("axis", 1)));
    r.k_map = quant::parse_trellis_k_map(a.get_or("k-map", ""));
    quant::check_trellis_recipe(r, "arguments: --bits/--down-axis/--axis/--k-map");
    o.trellis = r;
  }

  if (!a.has("calib"))
    for (const char* f : {"calib-tokens", "calib-ctx", "damp", "calib-layers"})
      if (a.has(f)) fail("arguments: --{} goes with --calib TEXT", f);

  ThreadPool pool(int(a.get_int("threads", 0)));
  // LDLQ: the dense model over the calibration text, then every coded linear against its inputs' E[x xᵀ]. The Hessians
  // of a group of layers are summed in one pass and held until those layers are coded; the next group's pass runs
  // when the converter first asks for one of its modules (it codes the layers in order). All layers in one pass
  // where their Hessians fit in half the memory; else as many a pass as fit (--calib-layers sets it).
  std::map<std::string, std::shared_ptr<const std::vector<double>>> hessians;
  struct CalibrationTotals {
    int64_t tokens = 0, ctx = 0, passes = 0;
    double seconds = 0;
  } cal;
  CalibrationOptions co;
  std::vector<int32_t> calib_ids;
  std::map<std::string, int64_t> layer_of;  // module path -> its layer
  int64_t group = 0;                          // layers a pass
  if (auto calib = a.get("calib")) {
    co.model_dir = o.in_dir;
    co.ctx = a.get_int("calib-ctx", std::min<int64_t>(1024, c.max_position > 0 ? c.max_position : 1024));
    co.max_tokens = a.get_int("calib-tokens", 65536);
    if (co.max_tokens < 0) fail("arguments: --calib-tokens must be 0 (all) or positive, got {}", co.max_tokens);
    co.threads = int(a.get_int("threads", 0));
    o.ldlq.damp = a.get_double("damp", 0.01);
    if (!(o.ldlq.damp > 0)) fail("arguments: --damp must be positive, got {}", o.ldlq.damp);
    const double layer_gb = calibration_hessian_bytes_per_layer(c) * 1e-9;
    const double ram_gb = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE)) * 1e-9;
    if (a.has("calib-layers")) {
      group = a.get_int("calib-layers", 0);
      if (group < 1) fail("arguments: --calib-layers must be at least 1, got {}", group);
    } else {
      group = ram_gb > 0 ? int64_t(0.5 * ram_gb / layer_gb) : c.n_layers;
      if (group < 1)
        fail("arguments: --calib: one layer's input Hessians take {:.1f} GB (n^2 doubles per linear input) and this machine has "
             "{:.1f} GB of memory",
             layer_gb, ram_gb);
    }
    group = std::min<int64_t>(group, c.n_layers);
    const int64_t passes = (c.n_layers + group - 1) / group;
    std::printf("calibration: the input Hessians take %.2f GB a layer, %.2f GB for %lld layer(s) a pass; %lld pass(es) over the text\n",
                layer_gb, layer_gb * double(group), (long long)group, (long long)passes);
    const std::string text = read_text_file(*calib);
    calib_ids = Tokenizer::from_file(o.in_dir).encode(text, true);
    for (int64_t L = 0; L < c.n_layers; ++L) {
      const std::string prefix = fmt::format(fmt::runtime(arch.names.layer), L);
      for (const auto& t : o.tensors)
        if (t.name.compare(0, prefix.size(), prefix) == 0 && t.name.size() > 7) layer_of[t.name.substr(0, t.name.size() - 7)] = L;
    }
    o.input_hessian = [&](const std::string& module) -> const std::vector<double>* {
      const auto lit = layer_of.find(module);
      if (lit == layer_of.end()) return nullptr;  // not a layer linear (the head, an embedding)
      const int64_t L = lit->second;
      if (L < co.first_layer || co.end_layer < 0 || L >= co.end_layer) {  // the group holding L: summed in one more pass
        hessians.clear();
        co.first_layer = L / group * group;
        co.end_layer = std::min<int64_t>(co.first_layer + group, c.n_layers);
        const std::string what = group >= c.n_layers ? std::string("calibrating")
                                                     : fmt::format("calibrating layers {}-{}", co.first_layer, co.end_layer - 1);
        std::unique_ptr<Progress> cp;
        int64_t shown = 0;
        co.progress = [&](int64_t done, int64_t total) {
          if (!cp) cp = std::make_unique<Progress>(what, uint64_t(total));
          if (done > shown) cp->advance(uint64_t(done - shown)), shown = done;
        };
        Calibration pass = calibrate_input_hessians(calib_ids, co);
        if (cp) cp->finish();
        co.progress = nullptr;
        hessians = pass.take_means();
        cal.tokens = pass.tokens, cal.ctx = pass.ctx, cal.seconds += pass.seconds, cal.passes++;
      }
      const auto it = hessians.find(module);
      return it == hessians.end() ? nullptr : it->second.get();
    };
  }
  uint64_t total = 0;
  {
    const Checkpoint ck = Checkpoint::open(o.in_dir);
    for (const auto& t : o.tensors)
      if (const TensorInfo* i = ck.find(t.name)) total += i->nbytes;
  }
  Progress prog("quantizing", total);
  const quant::AffineConvertStats st = quant::affine_convert_checkpoint(o, [&](uint64_t n) { prog.advance(n); }, &pool);
  prog.finish();
  if (trellis) {
    std::printf("wrote %s: %llu modules trellis-coded (k=%d, down axis %d%s%s%s), %llu tensors, %.3f GB -> %.3f GB in "
                "%llu shard(s); copied %zu tokenizer/config file(s)\n",
                out->c_str(), (unsigned long long)st.modules_quantized, o.trellis->bits, o.trellis->down_axis,
                o.trellis->axis == 0 ? ", the others axis 0" : "",
                a.has("k-map") ? ", k-map " : "", a.get_or("k-map", "").c_str(), (unsigned long long)st.tensors_written,
                double(st.bytes_in) * 1e-9, double(st.bytes_out) * 1e-9, (unsigned long long)st.shards, st.copied_files.size());
    const std::string how = o.encode.block_viterbi ? fmt::format("GPU Viterbi; scales, targets and packing on {} CPU threads", pool.size())
                                                   : fmt::format("CPU Viterbi, {} threads, {}", pool.size(), quant::trellis_isa_name(o.encode.isa));
    if (a.has("calib"))
      std::printf("LDLQ: %llu modules against their input Hessians (%lld calibration ids, windows of %lld, %lld pass(es), %.1f s; damp %g)\n",
                  (unsigned long long)st.modules_ldlq, (long long)cal.tokens, (long long)cal.ctx, (long long)cal.passes, cal.seconds,
                  o.ldlq.damp);
    std::printf("encoder: %llu weights in %.2f s, %.3g weights/s (%s)\n", (unsigned long long)st.weights_encoded, st.encode_seconds,
                st.encode_seconds > 0 ? double(st.weights_encoded) / st.encode_seconds : 0.0, how.c_str());
    for (const auto& s : st.left_dense) std::printf("left dense: %s\n", s.c_str());
    return 0;
  }
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

ARBOR_VERB("quantize", "write a dense checkpoint as an MLX affine or trellis quantized one (--model IN --out OUT --bits 4)",
           "--model IN --out OUT [flags]",
           "  --model DIR           the dense checkpoint (a directory, or a repo id in the Hugging Face cache)\n"
           "  --out DIR             where the quantized checkpoint goes (must not exist, or be empty)\n"
           "  --format affine|trellis  MLX affine (default) or trellis (QTIP bitshift trellis, 1MAD, L 12, blocks of\n"
           "                        256; see --encoder): the layers' linears, embedding and head dense\n"
           "  --bits B              affine: 2, 3, 4, 5, 6 or 8 (default 4); trellis: 2, 3 or 4 (default 2)\n"
           "  --down-axis 0|1       trellis: the down projection coded along its outputs (0, stored transposed;\n"
           "                        default) or its inputs (1)\n"
           "  --axis 0|1            trellis: every other linear's axis (default 1, along its inputs; 0 codes\n"
           "                        along the outputs, which LDLQ (--calib) serves better: see docs/quality.md)\n"
           "  --k-map M=K,...       trellis: bits per module, M a path or its last parts (down_proj=4)\n"
           "  --encoder auto|cpu|cuda  trellis: where the Viterbi runs (default auto: the GPU when there is one,\n"
           "                        else the CPU's threads; both choose the same paths)\n"
           "  --calib TEXT          trellis: Hessian-aware rounding (LDLQ): run the dense model on the CPU over\n"
           "                        TEXT (tokenized whole) and code each linear to minimise its output error on\n"
           "                        those inputs; memory n^2 doubles per distinct linear input, time ~n^3 each\n"
           "  --calib-tokens N      ids of TEXT used, in windows spread evenly over it (default 65536; 0: all)\n"
           "  --calib-ctx N         calibration window in ids (default min(1024, max_position_embeddings))\n"
           "  --calib-layers N      layers whose input Hessians one pass over TEXT sums (default: all that fit in\n"
           "                        half the memory; each further group of layers costs one more pass)\n"
           "  --damp D              LDLQ damping, a fraction of the mean diagonal of E[x x^T] (default 0.01)\n"
           "  --rotate              rotate the residual stream by a random Hadamard matrix first, folded exactly\n"
           "                        into the weights (norm weights into the linears, a tied head untied):\n"
           "                        incoherent weights for the quantizer (pre-norm RMSNorm models, hidden a\n"
           "                        power of two; a dense f32 copy is written beside OUT meanwhile)\n"
           "  --rotate-seed N       the random signs' seed (default 0)\n"
           "  --group-size G        32, 64 or 128 (default 64)\n"
           "  --recipe R            mlx-lm's mixed recipes: mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6 (low bits,\n"
           "                        high bits for lm_head and v_proj/down_proj in some layers)\n"
           "  --shard-gb G          largest shard in GiB (default 5, as mlx-lm)\n"
           "  --threads N           threads that quantize rows (default: every CPU)\n",
           cmd_quantize);

}  // namespace
}  // namespace arbor::cli
