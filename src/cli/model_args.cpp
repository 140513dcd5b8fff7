// Model-loading flags.
#include "cli/model_args.h"

#include <charconv>
#include <chrono>
#include <cstdlib>

#include "backend/cpu/cpu_backend.h"
#ifdef ARBOR_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "core/error.h"
#include "core/json.h"

namespace arbor::cli {

std::set<std::string> model_value_flags() {
  return {"model", "config", "device", "threads", "weights", "ctx-size", "kv-blocks", "dtype"};
}
std::set<std::string> model_bool_flags() { return {"dummy-weights"}; }

std::string default_model_dir() {
  if (const char* env = std::getenv("ARBOR_MODEL"); env && *env) return env;
#ifdef ARBOR_DEFAULT_MODEL
  if (file_exists(std::string(ARBOR_DEFAULT_MODEL) + "/config.json")) return ARBOR_DEFAULT_MODEL;
#endif
  fail("arguments: no --model given and no default model found (set ARBOR_MODEL or pass --model DIR)");
}

LoadOptions load_options_from_args(const Args& a) {
  LoadOptions opt;
  opt.model_dir = a.get_or("model", "");
  opt.config_path = a.get_or("config", "");
  opt.dummy_weights = a.has("dummy-weights");
  if (opt.model_dir.empty() && opt.config_path.empty()) opt.model_dir = default_model_dir();
  if (!opt.dummy_weights && opt.model_dir.empty()) fail("arguments: --config FILE needs --dummy-weights (no checkpoint to read)");
  if (auto d = a.get("dtype")) {
    auto t = dtype_from_name(*d == "bf16" ? "BF16" : *d == "f16" ? "F16" : *d == "f32" ? "F32" : *d);
    if (!t || !dtype_is_float(*t) || *t == DType::F64) fail("arguments: --dtype must be bf16, f16 or f32, got '{}'", *d);
    opt.dummy_dtype = *t;
  }
  opt.ctx_size = a.get_int("ctx-size", 0);
  opt.kv_blocks = a.get_int("kv-blocks", 0);
  return opt;
}

std::unique_ptr<Backend> make_backend_from_args(const Args& a) {
  std::string device = a.get_or("device", "cpu");
  std::string weights = a.get_or("weights", "copy");
  if (weights != "copy" && weights != "mmap") fail("arguments: --weights must be 'copy' or 'mmap', got '{}'", weights);
  if (device == "cpu") {
    int threads = int(a.get_int("threads", 0));
    return std::make_unique<CpuBackend>(threads, weights == "copy" ? WeightPlacement::Copy : WeightPlacement::Mapped);
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
