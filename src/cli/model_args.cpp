// Model-loading flags.
#include "cli/model_args.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <cstdlib>

#include "backend/cpu/cpu_backend.h"
#ifdef ARBOR_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "core/error.h"
#include "core/json.h"
#include "quant/affine.h"
#include "quant/trellis_convert.h"

namespace arbor::cli {

std::set<std::string> model_value_flags() {
  return {"model",    "config",   "device", "threads",    "weights", "ctx-size", "kv-blocks",
          "dtype",    "cpu-gemm", "kv-cache", "bits", "group-size", "format", "down-axis", "axis"};
}
std::set<std::string> model_bool_flags() { return {"dummy-weights"}; }

namespace {

// The Hugging Face hub cache, as huggingface_hub finds it: $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE,
// $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub.
std::string hf_hub_cache() {
  auto env = [](const char* k) -> std::string {
    const char* v = std::getenv(k);
    return v && *v ? v : "";
  };
  if (auto d = env("HF_HUB_CACHE"); !d.empty()) return d;
  if (auto d = env("HUGGINGFACE_HUB_CACHE"); !d.empty()) return d;
  if (auto d = env("HF_HOME"); !d.empty()) return d + "/hub";
  if (auto d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/huggingface/hub";
  return env("HOME") + "/.cache/huggingface/hub";
}

// "org/name": letters, digits, '-', '_', '.' on each side of one slash.
bool looks_like_repo_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size() || s.find('/', slash + 1) != std::string::npos) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/'; });
}

}  // namespace

std::string resolve_model_dir(const std::string& spec, std::string* repo_id) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (spec.empty() || fs::exists(spec, ec) || !looks_like_repo_id(spec)) return spec;  // a path (errors name it later)
  const std::string cache = hf_hub_cache();
  const fs::path repo = fs::path(cache) / ("models--" + spec.substr(0, spec.find('/')) + "--" + spec.substr(spec.find('/') + 1));
  if (!fs::is_directory(repo / "snapshots", ec))
    fail("arguments: --model {}: no such directory, and no download of it in the Hugging Face cache ({} not found; the cache "
         "is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)",
         spec, repo.string());
  std::string rev;
  if (std::ifstream f(repo / "refs" / "main"); f) std::getline(f, rev);
  fs::path snap;
  if (!rev.empty() && fs::is_directory(repo / "snapshots" / rev, ec)) {
    snap = repo / "snapshots" / rev;
  } else {
    std::vector<fs::path> all;
    for (const auto& e : fs::directory_iterator(repo / "snapshots", ec))
      if (e.is_directory()) all.push_back(e.path());
    if (all.size() != 1)
      fail("arguments: --model {}: {} has {} snapshots and no refs/main naming one; pass the snapshot's directory", spec,
           (repo / "snapshots").string(), all.size());
    snap = all[0];
  }
  if (repo_id) *repo_id = spec;
  return snap.string();
}

ChatTemplate chat_template_from_args(const Args& a, const std::string& tok_dir) {
  auto t = a.get("chat-template");
  if (!t) return ChatTemplate::from_model_dir(tok_dir);
  const bool is_file = std::filesystem::exists(*t);
  const auto builtin = is_file ? std::nullopt : ChatTemplate::builtin(*t);
  if (!is_file && !builtin) fail("arguments: --chat-template {}: no such file, and not a built-in template (chatml)", *t);
  return ChatTemplate::from_source_for_dir(builtin ? *builtin : read_text_file(*t), tok_dir);
}

std::string default_model_dir() {
  if (const char* env = std::getenv("ARBOR_MODEL"); env && *env) return env;
#ifdef ARBOR_DEFAULT_MODEL
  if (file_exists(std::string(ARBOR_DEFAULT_MODEL) + "/config.json")) return ARBOR_DEFAULT_MODEL;
#endif
  fail("arguments: no --model given and no default model found (set ARBOR_MODEL or pass --model DIR)");
}

DummyQuant dummy_quant_from_args(const Args& a, bool dummy_weights) {
  DummyQuant q;
  const std::string format = a.get_or("format", a.has("bits") || a.has("group-size") ? "affine" : "dense");
  if (format != "dense" && format != "affine" && format != "trellis")
    fail("arguments: --format must be dense, affine or trellis (the dummy weights' format), got '{}'", format);
  for (const char* f : {"down-axis", "axis"})
    if (format != "trellis" && a.has(f)) fail("arguments: --{} is for --format trellis", f);
  if (format == "dense") {
    if (a.has("bits") || a.has("group-size")) fail("arguments: --bits/--group-size make quantized weights, not --format dense");
    return q;
  }
  if (!dummy_weights)
    fail("arguments: --format/--bits/--group-size make quantized --dummy-weights; a checkpoint's quantization comes from its "
         "config.json");
  if (format == "trellis") {  // as arbor synth --format trellis writes them
    if (a.has("group-size")) fail("arguments: --group-size is for affine weights (trellis blocks are 256)");
    q.format = WeightFormat::Trellis;
    q.trellis_bits = int(a.get_int("bits", 2));
    q.trellis_down_axis = int(a.get_int("down-axis", 0));
    q.trellis_axis = int(a.get_int("axis", 1));
    quant::TrellisRecipe r;
    r.bits = q.trellis_bits, r.down_axis = q.trellis_down_axis, r.axis = q.trellis_axis;
    quant::check_trellis_recipe(r, "arguments: --bits/--down-axis/--axis");
    return q;
  }
  q.format = WeightFormat::Affine;
  q.affine = {int(a.get_int("group-size", 64)), int(a.get_int("bits", 4))};
  quant::check_affine_params(q.affine, "arguments: --bits/--group-size");
  return q;
}

LoadOptions load_options_from_args(const Args& a) {
  LoadOptions opt;
  opt.model_dir = resolve_model_dir(a.get_or("model", ""));
  opt.config_path = a.get_or("config", "");
  opt.dummy_weights = a.has("dummy-weights");
  if (opt.model_dir.empty() && opt.config_path.empty()) opt.model_dir = default_model_dir();
  if (!opt.dummy_weights && opt.model_dir.empty()) fail("arguments: --config FILE needs --dummy-weights (no checkpoint to read)");
  if (auto d = a.get("dtype")) {
    auto t = dtype_from_name(*d == "bf16" ? "BF16" : *d == "f16" ? "F16" : *d == "f32" ? "F32" : *d);
    if (!t || !dtype_is_float(*t) || *t == DType::F64) fail("arguments: --dtype must be bf16, f16 or f32, got '{}'", *d);
    opt.dummy_dtype = *t;
  }
  opt.dummy_quant = dummy_quant_from_args(a, opt.dummy_weights);
  opt.ctx_size = a.get_int("ctx-size", 0);
  opt.kv_blocks = a.get_int("kv-blocks", 0);
  opt.kv_cache = a.get_or("kv-cache", "bf16");
  return opt;
}

std::unique_ptr<Backend> make_backend_from_args(const Args& a) {
  std::string device = a.get_or("device", "cpu");
  std::string weights = a.get_or("weights", "copy");
  if (weights != "copy" && weights != "mmap") fail("arguments: --weights must be 'copy' or 'mmap', got '{}'", weights);
  const cpu::GemmMode gemm = cpu::parse_gemm_mode(a.get_or("cpu-gemm", "bf16"), "--cpu-gemm");  // checked for any device
  if (device == "cpu") {
    int threads = int(a.get_int("threads", 0));
    auto be = std::make_unique<CpuBackend>(threads, weights == "copy" ? WeightPlacement::Copy : WeightPlacement::Mapped);
    be->set_gemm_mode(gemm);
    return be;
  }
  if (device == "cuda") {
#ifdef ARBOR_HAS_CUDA
    return make_cuda_backend(0);
#else
    fail("arguments: --device cuda: this build has no CUDA backend (configure with nvcc available)");
#endif
  }
  fail("arguments: --device must be 'cpu' or 'cuda', got '{}'", device);
}

LoadedModel load_model_from_args(const Args& a, int64_t max_step_tokens) {
  LoadOptions opt = load_options_from_args(a);
  opt.max_step_tokens = max_step_tokens;
  LoadedModel lm;
  lm.backend = make_backend_from_args(a);
  auto t0 = std::chrono::steady_clock::now();
  lm.model = std::make_unique<Model>(opt, *lm.backend);
  lm.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return lm;
}

std::string kv_bytes_per_codec(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t plain_bytes) {
  std::string out;
  for (const char* name : {"bf16", "affine8", "affine4", "k8v4", "k8v3"}) {
    const KVCodecPair c = parse_kv_codec(name);
    out += out.empty() ? "" : ", ";
    try {
      check_kv_codec(c, head_dim);
      out += fmt::format("{} {}", name, n_layers * c.token_bytes(n_kv_heads, head_dim, plain_bytes));
    } catch (const Error&) {
      out += fmt::format("{} n/a (head_dim {})", name, head_dim);
    }
  }
  return out;
}

std::vector<int32_t> parse_id_list(const std::string& s, const char* flag, const char* what) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int32_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < 0)
      fail("arguments: --{}: entry {} ('{}') is not {}", flag, out.size(), item, what);
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

}  // namespace arbor::cli
