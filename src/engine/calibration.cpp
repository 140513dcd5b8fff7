// Calibration runs (engine/calibration.h): the forward is run_perplexity's, the rows come from the CPU
// backend's linear observer.
#include "engine/calibration.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/perplexity.h"
#include "kv/block_pool.h"
#include "model/model.h"

namespace arbor {

Calibration calibrate_input_hessians(std::span<const int32_t> ids, const CalibrationOptions& opt) {
  ARBOR_CHECK(opt.ctx >= 2, "calibration: --calib-ctx must be at least 2, got {}", opt.ctx);
  ARBOR_CHECK(ids.size() >= 2, "calibration: the text has {} ids; at least 2 are needed", ids.size());
  // A text longer than max_tokens: windows of ctx ids spread evenly over it (a corpus file is often ordered
  // by source; its first ids alone would be one source).
  std::vector<int32_t> spread;
  if (opt.max_tokens > 0 && int64_t(ids.size()) > opt.max_tokens) {
    const int64_t n = int64_t(ids.size()), w = std::max<int64_t>(1, opt.max_tokens / opt.ctx);
    const int64_t len = std::min(opt.ctx, opt.max_tokens), stride = n / w;
    for (int64_t i = 0; i < w; ++i) spread.insert(spread.end(), ids.begin() + i * stride, ids.begin() + i * stride + len);
    ids = spread;
  }
  const auto t0 = std::chrono::steady_clock::now();
  CpuBackend be(opt.threads, WeightPlacement::Copy);
  be.set_gemm_mode(cpu::GemmMode::Bf16);
  LoadOptions lo;
  lo.model_dir = opt.model_dir;
  lo.show_progress = false;
  const int64_t ctx = std::min<int64_t>(opt.ctx, int64_t(ids.size()));
  lo.ctx_size = std::max<int64_t>(ctx - 1, 1);
  lo.max_step_tokens = opt.step_tokens;
  lo.kv_blocks = perplexity_kv_blocks(ctx, opt.step_tokens, lo.block_size);
  Model model(lo, be);

  // The linears of the chosen layers by their bound Linear; the embedding and the head are not calibrated.
  const ArchDescriptor& arch = model.arch();
  const int64_t n_layers = model.config().n_layers, end = opt.end_layer < 0 ? n_layers : std::min(opt.end_layer, n_layers);
  ARBOR_CHECK(opt.first_layer >= 0 && opt.first_layer < end, "calibration: layers [{}, {}) of a {}-layer model", opt.first_layer,
              opt.end_layer, n_layers);
  std::map<const Linear*, std::string> names;
  const auto modules = model.matrix_modules();
  for (int64_t L = opt.first_layer; L < end; ++L) {
    const std::string prefix = fmt::format(fmt::runtime(arch.names.layer), L);
    for (const auto& [name, l] : modules)
      if (name.compare(0, prefix.size(), prefix) == 0) names[l] = name;
  }

  Calibration cal;
  // A linear whose input equals the previous call's (same rows, same values) reads what that one read: it
  // shares its Hessian, and the rows are summed once.
  std::vector<float> prev_x;  // the last summed call's input [prev_rows, its Hessian's n]
  int64_t prev_rows = 0;
  std::shared_ptr<quant::InputHessian> prev_h;
  be.set_linear_observer([&](const Tensor& x, const Linear& l) {
    const auto it = names.find(&l);
    if (it == names.end()) {  // the head, or a layer not chosen
      prev_h.reset();
      return;
    }
    const int64_t T = x.rows(), n = x.cols();
    const bool same = prev_h && prev_rows == T && prev_h->n() == n &&
                      std::memcmp(prev_x.data(), x.as<float>(), size_t(T * n) * sizeof(float)) == 0;
    ARBOR_CHECK(x.dtype == DType::F32, "calibration: '{}' got {} activations (F32 expected)", it->second, dtype_name(x.dtype));
    auto& h = cal.hessians[it->second];
    if (same) {
      if (!h) h = prev_h;  // first seen with this input: share
      if (h == prev_h) return;
    }
    if (!h) h = std::make_shared<quant::InputHessian>(n);
    ARBOR_CHECK(h->n() == n, "calibration: '{}' got inputs of {} columns, then {}", it->second, h->n(), n);
    h->add(x.as<float>(), T, &be.pool());
    prev_x.assign(x.as<float>(), x.as<float>() + T * n);
    prev_rows = T;
    prev_h = h;
  });

  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  PerplexityOptions po;
  po.ctx = ctx;
  po.step_tokens = opt.step_tokens;
  po.host_threads = opt.threads;
  po.progress = opt.progress;
  run_perplexity(model, pool, ids, po);
  be.set_linear_observer(nullptr);
  for (const auto& [l, name] : names)
    ARBOR_CHECK(cal.hessians.count(name), "calibration: linear '{}' never ran in the forward", name);
  cal.tokens = int64_t(ids.size());
  cal.ctx = ctx;
  cal.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return cal;
}

std::map<std::string, std::shared_ptr<const std::vector<double>>> Calibration::take_means() {
  std::map<std::string, std::shared_ptr<const std::vector<double>>> out;
  std::map<const quant::InputHessian*, std::shared_ptr<const std::vector<double>>> done;
  for (const auto& [module, h] : hessians) {
    auto& m = done[h.get()];
    if (!m) m = std::make_shared<const std::vector<double>>(h->take_mean());
    out[module] = m;
  }
  hessians.clear();
  return out;
}

double calibration_hessian_bytes_per_layer(const ModelConfig& c) {
  const double h = double(c.hidden_size), q = double(c.q_dim()), f = double(c.intermediate_size);
  return (2 * h * h + q * q + f * f) * 8;
}

}  // namespace arbor
