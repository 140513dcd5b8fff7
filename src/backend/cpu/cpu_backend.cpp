// CPU implementations of the backend ops (the reference the CUDA backend is tested against).
// Linear layers go to the ISA-specific kernels in linear_*.cpp; the rest are f32 loops here.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/cpu/attention_bf16.h"
#include "backend/cpu/attention_blocked.h"
#include "backend/cpu/attention_coded.h"
#include "backend/cpu/bandwidth.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/linear_affine.h"
#include "backend/cpu/linear_trellis.h"
#include "backend/cpu/vec.h"
#include "core/error.h"
#include "quant/trellis.h"

namespace arbor {

struct CpuBackend::Block {
  void* p = nullptr;          // aligned_alloc'd, or huge.data()
  cpu::HugePageBuffer huge;
  ~Block() {
    if (!huge.data()) std::free(p);
  }
};

CpuBackend::CpuBackend(int n_threads, WeightPlacement placement) : pool_(n_threads), placement_(placement) {}
CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const {
  return fmt::format("cpu ({} threads, weights {})", pool_.size(), placement_ == WeightPlacement::Copy ? "copied" : "mapped");
}

void* CpuBackend::own(size_t bytes, bool huge, bool kv) {
  auto b = std::make_unique<Block>();
  bytes = std::max<size_t>(bytes, 64);
  if (huge && bytes >= (size_t(2) << 20)) {
    // Huge pages: decode streams every weight once per token; 4 KiB pages would add TLB misses.
    b->huge = cpu::HugePageBuffer(bytes);
    b->p = b->huge.data();
  } else {
    b->p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!b->p) throw std::bad_alloc();
  }
  void* p = b->p;
  (kv ? kv_owned_ : owned_).push_back(std::move(b));
  return p;
}

Tensor CpuBackend::alloc(DType t, std::initializer_list<int64_t> shape) {
  Tensor x(nullptr, t, shape);
  x.data = own(x.nbytes(), false);
  return x;
}

Tensor CpuBackend::load_weight(const Tensor& host) {
  // Vectors (norm weights, biases) become f32 so the ops never convert per element per token.
  if (host.ndim <= 1 && host.dtype != DType::F32) {
    Tensor out(nullptr, DType::F32, {host.numel()});
    out.data = own(out.nbytes(), false);
    float* o = out.as<float>();
    for (int64_t i = 0; i < host.numel(); ++i)
      o[i] = host.dtype == DType::BF16 ? bf16_to_f32(host.as<uint16_t>()[i])
             : host.dtype == DType::F16 ? f16_to_f32(host.as<uint16_t>()[i])
                                        : fail_value(host);
    return out;
  }
  if (placement_ == WeightPlacement::Mapped) return host;
  Tensor out = host;
  out.data = own(host.nbytes(), true);
  std::memcpy(out.data, host.data, host.nbytes());
  return out;
}

namespace {

inline float load_elem(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.as<float>()[i];
    case DType::BF16: return bf16_to_f32(t.as<uint16_t>()[i]);
    case DType::F16: return f16_to_f32(t.as<uint16_t>()[i]);
    default: fail("cpu: tensor dtype {} is not a float type", dtype_name(t.dtype));
  }
}

// Dense F32/F16/BF16 weights at any row count: cpu::linear picks the ISA level and GEMV (rows <= 8) or
// GEMM (linear_dispatch.cpp).
void dense_linear(ThreadPool& pool, const Tensor& x, const Linear& l, Tensor y) {
  cpu::linear(pool, x.as<float>(), x.rows(), l.cols(), l.data.data, l.data.dtype, l.rows(), l.bias.empty() ? nullptr : l.bias.as<float>(),
              y.as<float>());
}

void bf16_gemm_linear(ThreadPool& pool, const Tensor& x, const Linear& l, Tensor y) {
  cpu::gemm_bf16(pool, x.as<float>(), x.rows(), l.cols(), l.data.data, l.data.dtype, l.rows(), l.bias.empty() ? nullptr : l.bias.as<float>(),
                 y.as<float>());
}

bool dense_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

cpu::AffineMatrix affine_matrix(const Linear& l) {
  return {l.data.as<uint32_t>(), l.scales.data, l.biases.data, l.scales.dtype, l.bits, l.group_size, l.rows(), l.cols()};
}

// MLX affine weights at any row count (cpu/linear_affine.h): the fused GEMV for rows <= 8, the GEMM over
// dequantized panels above, on the ISA level this CPU has. Scales and biases as stored (F32/F16/BF16).
void affine_linear(ThreadPool& pool, const Tensor& x, const Linear& l, Tensor y) {
  cpu::linear_affine(pool, x.as<float>(), x.rows(), affine_matrix(l), l.bias.empty() ? nullptr : l.bias.as<float>(), y.as<float>());
}

// Affine weights in bf16 (fast) mode: prompt chunks on AVX-512 BF16 (panels dequantized to bf16, x rounded once:
// gemm_bf16), and decode rows of 2/4/8-bit weights on AVX2 (3/5/6-bit with AVX-512 VBMI; x quantized to int8 per 32
// columns: the q8 GEMV).
void affine_bf16_linear(ThreadPool& pool, const Tensor& x, const Linear& l, Tensor y) {
  cpu::linear_affine(pool, x.as<float>(), x.rows(), affine_matrix(l), l.bias.empty() ? nullptr : l.bias.as<float>(), y.as<float>(),
                     cpu::GemmMode::Bf16);
}
// Prompt rows in bf16 mode, however few: the bf16 GEMM over dequantized panels (never the q8 GEMV).
void affine_prompt_linear(ThreadPool& pool, const Tensor& x, const Linear& l, Tensor y) {
  cpu::linear_affine(pool, x.as<float>(), x.rows(), affine_matrix(l), l.bias.empty() ? nullptr : l.bias.as<float>(), y.as<float>(),
                     cpu::GemmMode::Bf16Prompt);
}

// Trellis weights at any row count: cpu/linear_trellis (GEMV up to kLinearGemvMaxT rows, then the tiled
// path; AVX-512 or AVX2, else the reference). load_linear made the words plain and the scales f32.
void trellis_linear(ThreadPool& pool, const Tensor& x, const Linear& l, Tensor y) {
  const cpu::TrellisWeights w{l.data.as<uint32_t>(), l.scales.as<float>(), l.bits, l.axis, l.rows(), l.cols()};
  cpu::linear_trellis(pool, x.as<float>(), x.rows(), w, l.bias.empty() ? nullptr : l.bias.as<float>(), y.as<float>());
}

bool affine_bits(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8; }
bool affine_group(int g) { return g == 32 || g == 64 || g == 128; }

struct LinearKernelEntry {
  WeightFormat format;
  int64_t min_rows, max_rows;  // activation rows this kernel takes
  const char* what;            // for error messages
  CpuBackend::LinearKernel fn;
};
constexpr LinearKernelEntry kLinearKernels[] = {
    {WeightFormat::Dense, 0, INT64_MAX, "dense F32/F16/BF16 at any rows", dense_linear},
    {WeightFormat::Affine, 0, INT64_MAX, "affine 2/3/4/5/6/8-bit g32/64/128 at any rows (fused GEMV to 8 rows, GEMM above)", affine_linear},
    {WeightFormat::Trellis, 0, INT64_MAX, "trellis 2/3/4-bit (1MAD, L 12, blocks of 256) axis 0/1 at any rows", trellis_linear},
};

// The format's own constraints beyond the table's (dtype of dense weights, bits and group of affine ones).
bool variant_supported(const Linear& l) {
  if (l.format == WeightFormat::Dense) return dense_dtype(l.data.dtype);
  if (l.format == WeightFormat::Affine) return affine_bits(l.bits) && affine_group(l.group_size);
  if (l.format == WeightFormat::Trellis) return l.bits >= 2 && l.bits <= 4 && l.group_size == 256 && (l.axis == 0 || l.axis == 1);
  return true;
}

std::string supported_linears() {
  std::string s;
  for (const auto& e : kLinearKernels) s += (s.empty() ? "" : "; ") + std::string(e.what);
  return s;
}

bool format_supported(const Linear& l) {
  for (const auto& e : kLinearKernels)
    if (e.format == l.format && variant_supported(l)) return true;
  return false;
}

}  // namespace

CpuBackend::LinearKernel CpuBackend::pick_linear(const Linear& l, int64_t rows, cpu::GemmMode mode) {
  // Prompt chunks in bf16 mode: activations rounded to bf16 once (cpu/gemm_bf16); dense decode rows stay exact,
  // affine 2/4/8-bit (3/5/6 with VBMI) decode rows take the int8-activation GEMV (cpu/linear_affine.h). Bf16Prompt: rows known
  // to be prompt tokens, the bf16 GEMM at any count.
  if (mode == cpu::GemmMode::Bf16Prompt && l.format == WeightFormat::Dense && cpu::gemm_bf16_applies(l.data.dtype)) return bf16_gemm_linear;
  if (mode == cpu::GemmMode::Bf16Prompt && l.format == WeightFormat::Affine && cpu::cpu_features().avx512_bf16 && variant_supported(l))
    return affine_prompt_linear;
  if (mode == cpu::GemmMode::Bf16 && l.format == WeightFormat::Dense && rows > cpu::kLinearGemvMaxT && cpu::gemm_bf16_applies(l.data.dtype))
    return bf16_gemm_linear;
  if (mode == cpu::GemmMode::Bf16 && l.format == WeightFormat::Affine && rows > cpu::kLinearGemvMaxT && cpu::cpu_features().avx512_bf16 &&
      variant_supported(l))
    return affine_bf16_linear;
  if (mode == cpu::GemmMode::Bf16 && l.format == WeightFormat::Affine && rows <= cpu::kLinearGemvMaxT && variant_supported(l) &&
      cpu::linear_affine_q8_applies(l.bits))
    return affine_bf16_linear;
  for (const auto& e : kLinearKernels)
    if (e.format == l.format && variant_supported(l) && rows >= e.min_rows && rows <= e.max_rows)
      return e.fn;
  fail("cpu: no linear kernel for {} weights at {} rows; supported: {}", l.describe(), rows, supported_linears());
}

Linear CpuBackend::load_linear(const Linear& host) {
  ARBOR_CHECK(format_supported(host), "cpu: cannot load {} weights; supported: {}", host.describe(), supported_linears());
  Linear l = host;
  if (host.format == WeightFormat::Affine) {
    // Codes, scales and biases stay as stored (copied or mapped like dense weights): the kernels read F32,
    // F16 or BF16 scales directly, so a step reads 2 bytes per scale, not 4.
    const int64_t R = host.rows(), C = host.cols(), G = host.group_size;
    ARBOR_CHECK(C % G == 0 && (C * host.bits) % 32 == 0, "cpu: {}: columns do not divide into groups", host.describe());
    ARBOR_CHECK(host.data.dtype == DType::U32 && host.data.ndim == 2 && host.data.shape[0] == R && host.data.shape[1] == C * host.bits / 32,
                "cpu: {}: codes must be U32 [{}, {}]", host.describe(), R, C * host.bits / 32);
    auto check_params = [&](const Tensor& t, const char* what) {
      ARBOR_CHECK(t.ndim == 2 && t.shape[0] == R && t.shape[1] == C / G && dense_dtype(t.dtype), "cpu: {}: {} must be F32/F16/BF16 [{}, {}]",
                  host.describe(), what, R, C / G);
    };
    check_params(host.scales, "scales");
    check_params(host.biases, "biases");
    ARBOR_CHECK(host.scales.dtype == host.biases.dtype, "cpu: {}: scales are {} but biases {}", host.describe(), dtype_name(host.scales.dtype),
                dtype_name(host.biases.dtype));
    l.data = load_weight(host.data);
    l.scales = load_weight(host.scales);
    l.biases = load_weight(host.biases);
  } else if (host.format == WeightFormat::Trellis) {
    // Words in the plain layout [coded rows, words per row] (the interleaved k = 3 axis-0 layout is
    // de-interleaved into memory of our own); scales f32 [coded rows].
    const int64_t coded_rows = host.axis == 1 ? host.rows() : host.cols(), coded_cols = host.axis == 1 ? host.cols() : host.rows();
    const int64_t wpr = coded_cols * host.bits / 32;
    ARBOR_CHECK(coded_cols % 256 == 0, "cpu: {}: the coded dimension {} is not a multiple of 256", host.describe(), coded_cols);
    ARBOR_CHECK(host.data.dtype == DType::U32 && host.data.numel() == coded_rows * wpr, "cpu: {}: words must be U32 [{}, {}], got {} {}",
                host.describe(), coded_rows, wpr, dtype_name(host.data.dtype), host.data.shape_str());
    if (host.data.ndim == 3) {
      const std::vector<uint32_t> plain = quant::trellis_deinterleave_k3(host.data.as<const uint32_t>(), coded_rows, coded_cols);
      l.data = Tensor(own(plain.size() * 4, true), DType::U32, {coded_rows, wpr});
      std::memcpy(l.data.data, plain.data(), plain.size() * 4);
    } else {
      ARBOR_CHECK(host.data.ndim == 2 && host.data.shape[0] == coded_rows, "cpu: {}: words must be U32 [{}, {}], got {}", host.describe(),
                  coded_rows, wpr, host.data.shape_str());
      l.data = load_weight(host.data);
    }
    ARBOR_CHECK(host.scales.numel() == coded_rows && dense_dtype(host.scales.dtype), "cpu: {}: scales must be [{}] F16/F32/BF16, got {} {}",
                host.describe(), coded_rows, dtype_name(host.scales.dtype), host.scales.shape_str());
    l.scales = Tensor(own(size_t(coded_rows) * 4, false), DType::F32, {coded_rows});
    for (int64_t i = 0; i < coded_rows; ++i) l.scales.as<float>()[i] = load_elem(host.scales, i);
  } else {
    l.data = load_weight(host.data);
  }
  if (!host.bias.empty()) l.bias = load_weight(host.bias);
  return l;
}

void CpuBackend::alloc_kv(const KVLayout& layout) {
  ARBOR_CHECK(layout.codecs.empty() || int64_t(layout.codecs.size()) == layout.n_layers, "cpu: KV layout has {} layer codecs for {} layers",
              layout.codecs.size(), layout.n_layers);
  for (int64_t l = 0; l < layout.n_layers; ++l) check_kv_codec(layout.codec(l), layout.head_dim);
  kv_ = layout;
  const size_t rows = size_t(layout.n_blocks * layout.block_size * layout.n_kv_heads);
  // attention_coded unpacks codes with 8- and 16-byte loads that may reach a few bytes past a row.
  constexpr size_t kPoolPad = 64;
  k_pools_.clear(), v_pools_.clear();
  kv_owned_.clear();  // the previous layout's pools (bench --kv-sweep reallocates)
  for (int64_t l = 0; l < layout.n_layers; ++l) {
    const KVCodecPair& c = layout.codec(l);
    k_pools_.push_back(static_cast<uint8_t*>(own(rows * size_t(c.k.row_bytes(layout.head_dim, sizeof(float))) + kPoolPad, true, true)));
    v_pools_.push_back(static_cast<uint8_t*>(own(rows * size_t(c.v.row_bytes(layout.head_dim, sizeof(float))) + kPoolPad, true, true)));
  }
}

float* CpuBackend::k_pool(int64_t layer) const {
  ARBOR_CHECK(kv_.codec(layer).k.plain(), "cpu: k_pool: layer {} keys are coded ({})", layer, kv_.codec(layer).name());
  return reinterpret_cast<float*>(k_pools_[size_t(layer)]);
}
float* CpuBackend::v_pool(int64_t layer) const {
  ARBOR_CHECK(kv_.codec(layer).v.plain(), "cpu: v_pool: layer {} values are coded ({})", layer, kv_.codec(layer).name());
  return reinterpret_cast<float*>(v_pools_[size_t(layer)]);
}

float CpuBackend::fail_value(const Tensor& t) { fail("cpu: cannot convert a {} vector to f32", dtype_name(t.dtype)); }

void CpuBackend::embed(const Linear& emb, Tensor out, float scale) {
  const bool affine = emb.format == WeightFormat::Affine && affine_bits(emb.bits) && affine_group(emb.group_size) &&
                      dense_dtype(emb.scales.dtype) && emb.biases.dtype == emb.scales.dtype;
  ARBOR_CHECK((emb.format == WeightFormat::Dense && dense_dtype(emb.data.dtype)) || affine,
              "cpu: embed: no gather for {} tables; supported: dense F32/F16/BF16, affine (loaded by load_linear)", emb.describe());
  const Tensor& table = emb.data;
  const auto& tok = batch_->tokens;
  const int64_t C = emb.cols(), V = emb.rows();
  float* o = out.as<float>();
  for (size_t t = 0; t < tok.size(); ++t) {
    int32_t id = tok[t];
    if (id < 0) {  // token_from_last_pick
      const int64_t row = -1 - int64_t(id);
      ARBOR_CHECK(row < int64_t(last_pick_.size()), "embed: batch row {} takes the picked id of row {}, the last pick has {} rows", t, row,
                  last_pick_.size());
      id = last_pick_[size_t(row)];
    }
    ARBOR_CHECK(id < V, "embed: token id {} at batch row {} is outside the vocabulary ({})", id, t, V);
    float* ot = o + int64_t(t) * C;
    if (affine) {
      cpu::affine_dequantize_row(affine_matrix(emb), id, ot);
      for (int64_t c = 0; c < C; ++c) ot[c] *= scale;
    } else {
      for (int64_t c = 0; c < C; ++c) ot[c] = load_elem(table, int64_t(id) * C + c) * scale;
    }
  }
}

namespace {

void norm_row(NormOp op, const float* x, const float* w, const float* b, float eps, int64_t C, float* y) {
  if (op == NormOp::LayerNorm) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[c];
    mean /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (x[c] - mean) * (x[c] - mean);
    var /= double(C);
    float inv = float(1.0 / std::sqrt(var + eps));
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - float(mean)) * inv * w[c] + (b ? b[c] : 0.0f);
    return;
  }
  double ss = 0;
  for (int64_t c = 0; c < C; ++c) ss += double(x[c]) * x[c];
  float inv = float(1.0 / std::sqrt(ss / double(C) + eps));
  if (op == NormOp::RMSPlusOne)
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * inv * (1.0f + w[c]);
  else
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * inv * w[c];
}

}  // namespace

void CpuBackend::norm(NormOp op, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor out) {
  const int64_t R = x.rows(), C = x.cols();
  ARBOR_CHECK(w.numel() == C, "norm: weight has {} elements, rows have {}", w.numel(), C);
  const float* bp = b.empty() ? nullptr : b.as<float>();
  pool_.parallel_for(R, 1, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(op, x.as<float>() + r * C, w.as<float>(), bp, eps, C, out.as<float>() + r * C);
  });
}

void CpuBackend::head_norm(NormOp op, Tensor x, int64_t head_dim, const Tensor& w, float eps) {
  const int64_t R = x.numel() / head_dim;
  ARBOR_CHECK(w.numel() == head_dim, "head_norm: weight has {} elements, heads have {}", w.numel(), head_dim);
  float* p = x.as<float>();
  elementwise(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(op, p + r * head_dim, w.as<float>(), nullptr, eps, head_dim, p + r * head_dim);
  }, head_dim);
}

namespace {
// Adds the scope's wall time to *acc when acc is set (CpuBackend::set_phase_timing).
struct PhaseTimer {
  double* acc;
  std::chrono::steady_clock::time_point t0 = acc ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  ~PhaseTimer() {
    if (acc) *acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};
// The bytes a linear reads from its weights in one call.
double weight_bytes(const Linear& l) {
  return double(l.data.nbytes() + l.scales.nbytes() + l.biases.nbytes() + l.bias.nbytes());
}
}  // namespace

// Adds a linear's work over `rows` rows to the phase totals (set_phase_timing) and returns the accumulator of its
// time, or null when timing is off.
double* CpuBackend::linear_phase(int64_t rows, const Linear& l) {
  if (!phase_timing_) return nullptr;
  phases_.linear_flops += 2.0 * double(rows) * double(l.cols()) * double(l.rows());
  phases_.linear_bytes += weight_bytes(l);
  return &phases_.linear_s;
}

void CpuBackend::linear(const Tensor& x, const Linear& l, Tensor y) {
  ARBOR_CHECK(x.cols() == l.cols(), "linear: input has {} columns, weight {} expects {}", x.cols(), l.describe(), l.cols());
  if (observer_) observer_(x, l);
  PhaseTimer timer{linear_phase(x.rows(), l)};
  if (gemm_mode_ == cpu::GemmMode::Bf16)
    if (const uint8_t* kinds = row_kinds(x.rows())) return linear_by_kind(x, l, y, kinds);
  pick_linear(l, x.rows(), gemm_mode_)(pool_, x, l, y);
}

const uint8_t* CpuBackend::row_kinds(int64_t rows) {
  // A batch of only logit rows (Model::forward's LM-head chunks) keeps its parent's decode_rows, by token.
  if (!batch_ || batch_->decode_rows.empty() || rows <= 0) return nullptr;
  const auto& d = batch_->decode_rows;
  if (!batch_->tokens.empty() && d.size() != batch_->tokens.size()) return nullptr;
  if (!batch_->tokens.empty() && rows == int64_t(d.size())) return d.data();
  const auto& lr = batch_->logit_rows;  // the LM head runs on the rows whose logits are wanted
  if (rows != int64_t(lr.size())) return nullptr;
  kinds_.resize(lr.size());
  for (size_t i = 0; i < lr.size(); ++i) {
    if (lr[i] < 0 || size_t(lr[i]) >= d.size()) return nullptr;
    kinds_[i] = d[size_t(lr[i])];
  }
  return kinds_.data();
}

// Bf16 mode with the rows' kinds known: decode rows through the decode kernels (the exact dense GEMV, the
// affine q8 GEMV) in groups of at most kLinearGemvMaxT, prompt rows through the bf16 GEMM at any count;
// a step that mixes the two gathers each kind's rows, runs it, and scatters the results. Each row's
// arithmetic then depends on its kind only, not on what else the step holds.
void CpuBackend::linear_by_kind(const Tensor& x, const Linear& l, Tensor y, const uint8_t* kinds) {
  const int64_t T = x.rows(), K = x.cols(), N = y.cols();
  int64_t nd = 0;
  for (int64_t t = 0; t < T; ++t) nd += kinds[t] ? 1 : 0;
  auto run = [&](const Tensor& xs, Tensor ys, bool decode) {
    const int64_t n = xs.rows();
    if (!decode) return pick_linear(l, n, cpu::GemmMode::Bf16Prompt)(pool_, xs, l, ys);
    for (int64_t r0 = 0; r0 < n; r0 += cpu::kLinearGemvMaxT) {
      const int64_t m = std::min<int64_t>(cpu::kLinearGemvMaxT, n - r0);
      pick_linear(l, m, cpu::GemmMode::Bf16)(pool_, xs.row_slice(r0, m), l, ys.row_slice(r0, m));
    }
  };
  if (nd == 0 || nd == T) return run(x, y, nd == T);
  for (int decode = 0; decode < 2; ++decode) {
    const int64_t n = decode ? nd : T - nd;
    kind_x_.resize(size_t(n * K)), kind_y_.resize(size_t(n * N));
    int64_t i = 0;
    for (int64_t t = 0; t < T; ++t)
      if ((kinds[t] != 0) == bool(decode)) std::copy_n(x.as<float>() + t * K, K, kind_x_.data() + (i++) * K);
    run(Tensor(kind_x_.data(), DType::F32, {n, K}), Tensor(kind_y_.data(), DType::F32, {n, N}), decode);
    i = 0;
    for (int64_t t = 0; t < T; ++t)
      if ((kinds[t] != 0) == bool(decode)) std::copy_n(kind_y_.data() + (i++) * N, N, y.as<float>() + t * N);
  }
}

void CpuBackend::linear_multi(const Tensor& x, const LinearOut* outs, int n) {
  // Affine decode rows in the fast mode (q/k/v, gate/up of one K, bits and group): x quantized once and one
  // pass over the rows of all the matrices (cpu::linear_affine_multi); anything else one linear() each.
  bool fuse = n >= 2 && n <= 8 && gemm_mode_ == cpu::GemmMode::Bf16;
  if (const uint8_t* kinds = fuse ? row_kinds(x.rows()) : nullptr)  // only a step of decode rows alone
    fuse = std::all_of(kinds, kinds + x.rows(), [](uint8_t k) { return k != 0; });
  cpu::AffineOut ao[8];
  cpu::AffineMatrix ws[8];
  for (int i = 0; fuse && i < n; ++i) {
    const Linear& l = *outs[i].l;
    fuse = l.format == WeightFormat::Affine && variant_supported(l) && x.cols() == l.cols();
    if (fuse) {
      ws[i] = affine_matrix(l);
      ao[i] = {ws[i], l.bias.empty() ? nullptr : l.bias.as<float>(), outs[i].y.as<float>()};
    }
  }
  if (!fuse || !cpu::linear_affine_multi_fuses(ws, n, x.rows(), gemm_mode_)) return Backend::linear_multi(x, outs, n);
  for (int i = 0; observer_ && i < n; ++i) observer_(x, *outs[i].l);
  double* phase = nullptr;
  for (int i = 0; i < n; ++i) phase = linear_phase(x.rows(), *outs[i].l);
  PhaseTimer timer{phase};
  cpu::linear_affine_multi(pool_, x.as<float>(), x.rows(), ao, n, gemm_mode_);
}

void CpuBackend::rope(Tensor x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const Tensor& cos, const Tensor& sin) {
  const int64_t half = rot_dim / 2, n_pos = cos.shape[0];
  const auto& pos = batch_->rope_rows.empty() ? batch_->pos : batch_->rope_rows;
  ARBOR_CHECK(pos.size() == batch_->pos.size(), "rope: {} table rows for {} tokens", pos.size(), batch_->pos.size());
  for (size_t t = 0; t < pos.size(); ++t)
    ARBOR_CHECK(pos[t] >= 0 && pos[t] < n_pos, "rope: table row {} outside the table ({} rows)", pos[t], n_pos);
  elementwise(int64_t(pos.size()), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = cos.as<float>() + int64_t(pos[size_t(t)]) * half;
      const float* s = sin.as<float>() + int64_t(pos[size_t(t)]) * half;
      float* row = x.as<float>() + t * n_heads * head_dim;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = row + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          float a = v[i], b = v[i + half];
          v[i] = a * c[i] - b * s[i];
          v[i + half] = b * c[i] + a * s[i];
        }
      }
    }
  }, n_heads * head_dim);
}

void CpuBackend::kv_write(int64_t layer, const Tensor& k, const Tensor& v) {
  const int64_t H = kv_.n_kv_heads, hd = kv_.head_dim, row = H * hd, bs = kv_.block_size;
  const KVCodecPair& c = kv_.codec(layer);
  const int64_t kb = c.k.row_bytes(hd, sizeof(float)), vb = c.v.row_bytes(hd, sizeof(float));
  const auto& b = *batch_;
  std::vector<int64_t>& slots = kv_slots_;
  slots.resize(size_t(b.n_tokens()));
  for (int64_t t = 0; t < b.n_tokens(); ++t) {
    int32_t s = b.seq[size_t(t)], p = b.pos[size_t(t)];
    int32_t block = b.block_tables[size_t(int64_t(s) * b.max_blocks + p / bs)];
    ARBOR_CHECK(block >= 0 && block < kv_.n_blocks, "kv: sequence {} position {} has no valid block ({})", s, p, block);
    slots[size_t(t)] = int64_t(block) * bs + p % bs;
  }
  uint8_t* K = k_pools_[size_t(layer)];
  uint8_t* V = v_pools_[size_t(layer)];
  if (c.plain()) {
    for (int64_t t = 0; t < b.n_tokens(); ++t) {
      std::memcpy(K + slots[size_t(t)] * H * kb, k.as<float>() + t * row, size_t(row) * sizeof(float));
      std::memcpy(V + slots[size_t(t)] * H * vb, v.as<float>() + t * row, size_t(row) * sizeof(float));
    }
    return;
  }
  // Coded rows: each head's row encoded as it is written (quant/kv_codec's reference encoders).
  pool_.parallel_for(b.n_tokens() * H, 8, [&](int, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / H, h = i % H, slot = slots[size_t(t)];
      const float* kx = k.as<float>() + t * row + h * hd;
      const float* vx = v.as<float>() + t * row + h * hd;
      if (c.k.plain())
        std::memcpy(K + (slot * H + h) * kb, kx, size_t(hd) * sizeof(float));
      else
        kv_encode_row(c.k, kx, hd, K + (slot * H + h) * kb);
      if (c.v.plain())
        std::memcpy(V + (slot * H + h) * vb, vx, size_t(hd) * sizeof(float));
      else
        kv_encode_row(c.v, vx, hd, V + (slot * H + h) * vb);
    }
  });
}

void CpuBackend::attention(int64_t layer, const Tensor& q, const AttentionParams& p, Tensor out) {
  PhaseTimer timer{phase_timing_ ? &phases_.attention_s : nullptr};
  const auto& b = *batch_;
  const int64_t hd = p.head_dim, group = p.n_heads / p.n_kv_heads, bs = kv_.block_size;
  const KVCodecPair& codec = kv_.codec(layer);
  const bool blocked = codec.plain() && cpu::attention_block_applies(hd, group, p.softcap);
  const bool coded = !codec.plain() && cpu::attention_coded_applies(codec, hd, group);
  // Bf16 mode: prompt rows of plain layers through the bf16 kernel (attention_bf16.h), by the rows' kinds
  // where the batch says (as linear_by_kind), else by count as pick_linear (a step of more than
  // kLinearGemvMaxT rows is a prompt chunk). Decode rows, and every row in exact mode, keep
  // attention_blocked.
  const bool bf16 = blocked && gemm_mode_ == cpu::GemmMode::Bf16 && cpu::attention_bf16_applies(hd, group, p.softcap);
  const uint8_t* kinds = bf16 ? row_kinds(b.n_tokens()) : nullptr;
  auto bf16_row = [&](int64_t t) { return bf16 && (kinds ? kinds[t] == 0 : b.n_tokens() > cpu::kLinearGemvMaxT); };
  if (blocked || coded) {
    // Runs of consecutive tokens of one sequence at consecutive positions and of one kernel, up to 16
    // (kAttnBf16MaxRun for the bf16 kernel; a prefill chunk gives full runs, a decode step runs of one),
    // each with one kv head per work item. Items are dealt from both ends of the run list so a causal
    // prefill's cheap early runs and costly late ones are spread evenly over the threads' contiguous
    // shares.
    std::vector<std::pair<int64_t, int64_t>> runs;  // (first token, tokens)
    for (int64_t t = 0; t < b.n_tokens(); ++t) {
      if (!runs.empty()) {
        auto& [t0, n] = runs.back();
        const bool run_bf16 = bf16_row(t0);
        if (n < (run_bf16 ? cpu::kAttnBf16MaxRun : 16) && bf16_row(t) == run_bf16 && b.seq[size_t(t)] == b.seq[size_t(t0)] &&
            b.pos[size_t(t)] == b.pos[size_t(t0)] + n) {
          ++n;
          continue;
        }
      }
      runs.push_back({t, 1});
    }
    const int64_t n_runs = int64_t(runs.size());
    const cpu::AttnBlockArgs args{q.as<float>(),
                                  out.as<float>(),
                                  reinterpret_cast<const float*>(k_pools_[size_t(layer)]),
                                  reinterpret_cast<const float*>(v_pools_[size_t(layer)]),
                                  p.n_heads,
                                  p.n_kv_heads,
                                  hd,
                                  bs,
                                  p.scale,
                                  p.window};
    cpu::AttnCodedArgs cargs{q.as<float>(), out.as<float>(), k_pools_[size_t(layer)], v_pools_[size_t(layer)], codec.k, codec.v};
    cargs.kb = codec.k.row_bytes(hd, sizeof(float)), cargs.vb = codec.v.row_bytes(hd, sizeof(float));
    cargs.n_heads = p.n_heads, cargs.n_kv_heads = p.n_kv_heads, cargs.hd = hd, cargs.bs = bs;
    cargs.scale = p.scale, cargs.softcap = p.softcap, cargs.window = p.window;
    const size_t need =
        size_t(blocked ? std::max(cpu::attention_block_scratch_floats(hd, group), bf16 ? cpu::attention_bf16_scratch_floats(hd, group) : 0)
                       : cpu::attention_coded_scratch_floats(hd, group)) +
        16;
    // Coded layers: a work item takes a run and a range of kv heads (their rows sit side by side in a
    // slot, so the range is read as one span per position): as many heads as leave every thread an item.
    int64_t hc = 1;
    if (coded) {
      int64_t max_nt = 1;
      for (const auto& r : runs) max_nt = std::max(max_nt, r.second);
      hc = std::min<int64_t>(p.n_kv_heads, cpu::attention_coded_max_heads(max_nt, group));
      while (hc > 1 && n_runs * ((p.n_kv_heads + hc - 1) / hc) < pool_.size()) hc = (hc + 1) / 2;
    }
    const int64_t chunks = (p.n_kv_heads + hc - 1) / hc;
    pool_.parallel_for(n_runs * chunks, 1, [&](int, int64_t i0, int64_t i1) {
      thread_local std::vector<float> scratch;
      if (scratch.size() < need) scratch.resize(need);
      float* sp = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t k = item / chunks, g = item % chunks;
        const auto [t0, n] = runs[size_t(k % 2 == 0 ? k / 2 : n_runs - 1 - k / 2)];
        const int32_t s = b.seq[size_t(t0)];
        const int32_t* table = b.block_tables.data() + int64_t(s) * b.max_blocks;
        if (blocked && bf16_row(t0))
          cpu::attention_bf16(args, t0, n, b.pos[size_t(t0)], table, g, sp);
        else if (blocked)
          cpu::attention_block(args, t0, n, b.pos[size_t(t0)], table, g, sp);
        else
          cpu::attention_coded(cargs, t0, n, b.pos[size_t(t0)], table, g * hc, std::min(p.n_kv_heads, (g + 1) * hc), sp);
      }
    });
    return;
  }
  // Layers neither blocked kernel takes (no AVX-512, softcap on a plain layer, more than 8 query heads
  // per kv head): attention_kv.cpp, one work item per (token, KV head).
  attention_kv(layer, q, p, out);
}

namespace {
inline float act_fn(ActOp op, float x) {
  switch (op) {
    case ActOp::SiLU: return x / (1.0f + std::exp(-x));
    case ActOp::GeLU: return 0.5f * x * (1.0f + std::erf(x * float(M_SQRT1_2)));
    case ActOp::GeLUTanh: {
      const float k = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
    }
  }
  return x;
}
}  // namespace

// Elementwise ops over n values: on the pool's threads when there are enough of them (a prompt chunk; the
// 8192-wide SiLU-mul of 512 tokens took ~0.2 s a prompt on one thread), else inline (a decode step, where a
// hand-off would cost more than the work). Each element's arithmetic is the same either way.
void CpuBackend::elementwise(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t unit) {
  constexpr int64_t kParallelMin = 1 << 15, kGrain = 1024;  // in values
  if (n * unit < kParallelMin || pool_.size() == 1) {
    fn(0, n);
    return;
  }
  pool_.parallel_for(n, std::max<int64_t>(1, kGrain / unit), [&](int, int64_t i0, int64_t i1) { fn(i0, i1); });
}

void CpuBackend::activation(ActOp op, const Tensor& gate, const Tensor& up, Tensor out) {
  const int64_t n = up.numel();
  float* o = out.as<float>();
  const float* u = up.as<float>();
  const float* g = gate.empty() ? nullptr : gate.as<float>();
  elementwise(n, [&](int64_t i0, int64_t i1) {
    if (op == ActOp::SiLU) {  // the vector form (scalar expf was ~half of a 512-token prefill's elementwise time)
      if (g) cpu::vec_ops().silu_mul(g + i0, u + i0, o + i0, i1 - i0);
      else cpu::vec_ops().silu_mul(u + i0, nullptr, o + i0, i1 - i0);
    } else if (!g) {
      for (int64_t i = i0; i < i1; ++i) o[i] = act_fn(op, u[i]);
    } else {
      for (int64_t i = i0; i < i1; ++i) o[i] = act_fn(op, g[i]) * u[i];
    }
  });
}

void CpuBackend::add_scaled(Tensor y, const Tensor& x, float scale) {
  float* a = y.as<float>();
  const float* b = x.as<float>();
  elementwise(y.numel(), [&](int64_t i0, int64_t i1) {
    if (scale == 1.0f)
      for (int64_t i = i0; i < i1; ++i) a[i] += b[i];
    else
      for (int64_t i = i0; i < i1; ++i) a[i] += b[i] * scale;
  });
}

void CpuBackend::scale_softcap(Tensor x, float scale, float cap) {
  float* a = x.as<float>();
  elementwise(x.numel(), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float v = a[i] * scale;
      a[i] = cap > 0 ? cap * std::tanh(v / cap) : v;
    }
  });
}

void CpuBackend::gather_logit_rows(const Tensor& x, Tensor out) {
  const int64_t C = x.cols();
  const auto& rows = batch_->logit_rows;
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.as<float>() + int64_t(i) * C, x.as<float>() + int64_t(rows[i]) * C, size_t(C) * sizeof(float));
}

Tensor CpuBackend::upload_table(const std::vector<float>& host, std::initializer_list<int64_t> shape) {
  Tensor t = alloc(DType::F32, shape);
  ARBOR_CHECK(size_t(t.numel()) == host.size(), "cpu: table has {} values for shape {}", host.size(), t.shape_str());
  std::memcpy(t.data, host.data(), host.size() * sizeof(float));
  return t;
}

void CpuBackend::read_logits(const Tensor& logits, float* host) { std::memcpy(host, logits.data, logits.nbytes()); }

bool CpuBackend::argmax_rows_start(const Tensor& logits) {
  ARBOR_CHECK(logits.dtype == DType::F32, "cpu: argmax_rows: logits are {} (F32 expected)", dtype_name(logits.dtype));
  ARBOR_CHECK(picks_.size() < 2, "cpu: argmax_rows_start: two picks are already queued (wait for one first)");
  const int64_t R = logits.rows(), V = logits.cols();
  std::vector<int32_t> ids(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) ids[size_t(r)] = argmax(logits.as<float>() + r * V, V);
  last_pick_ = ids;
  picks_.push_back(std::move(ids));
  return true;
}

void CpuBackend::wait_pick(int32_t* host_ids) {
  ARBOR_CHECK(!picks_.empty(), "cpu: wait_pick: no pick is queued");
  std::copy(picks_.front().begin(), picks_.front().end(), host_ids);
  picks_.erase(picks_.begin());
}

}  // namespace arbor
