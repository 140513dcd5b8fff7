// MLX affine weights on CUDA (affine.h, affine_gemv.cu) against the host reference (quant::affine_dequantize,
// then a float matmul): the GEMV at 1, 3 and 8 rows for every bit width and
// group size, bf16 and f16 scales, odd shapes, with and without a bias, f32 and bf16 outputs; the fused
// q/k/v and gate/up forms; the quantized embedding gather; and whole affine checkpoints, CUDA against the
// CPU. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "backend/cuda/affine.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "engine/generate.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/weights.h"
#include "quant/affine.h"
#include "quant/affine_synth.h"

using namespace arbor;
using namespace arbor::cuda_test;
namespace fs = std::filesystem;

namespace {

// A random affine matrix on the host (codes uniform over the levels, scales and biases in `dt`) and its
// reference dequantization.
struct HostAffine {
  int64_t R, C;
  int bits, gs;
  DType dt;
  std::vector<uint32_t> codes;
  std::vector<uint16_t> scales, biases;
  std::vector<float> bias;  // the layer's bias [R], empty when none
  std::vector<float> w;     // dequantized [R, C]

  HostAffine(std::mt19937& rng, int64_t r, int64_t c, int b, int g, DType d, bool with_bias) : R(r), C(c), bits(b), gs(g), dt(d) {
    const int64_t W = C * bits / 32, G = C / gs;
    codes.assign(size_t(R * W), 0u);
    std::uniform_int_distribution<uint32_t> code(0, (1u << bits) - 1u);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j) quant::affine_or_code(codes.data() + i * W, j, bits, code(rng));
    std::uniform_real_distribution<float> u(0.5f, 1.5f), v(-1.0f, 1.0f);
    auto enc = [&](float f) { return dt == DType::F16 ? f32_to_f16(f) : f32_to_bf16(f); };
    const float step = 0.1f / float(1 << bits);  // groups spread over about [-0.05, 0.05]
    for (int64_t i = 0; i < R * G; ++i) {
      const float s = step * u(rng);
      scales.push_back(enc(s));
      biases.push_back(enc(-s * float((1 << bits) - 1) / 2 + 0.01f * v(rng)));
    }
    if (with_bias) bias = random_bf16(rng, size_t(R), 0.5f);
    w.resize(size_t(R * C));
    quant::affine_dequantize(codes.data(), scales.data(), biases.data(), dt, quant::affine_shape(R, C, {gs, bits}, "test"), w.data());
  }
  Linear host_linear() {
    Linear l;
    l.format = WeightFormat::Affine, l.n_rows = R, l.n_cols = C, l.bits = bits, l.group_size = gs;
    l.data = Tensor(codes.data(), DType::U32, {R, C * bits / 32});
    l.scales = Tensor(scales.data(), dt, {R, C / gs});
    l.biases = Tensor(biases.data(), dt, {R, C / gs});
    if (!bias.empty()) l.bias = Tensor(bias.data(), DType::F32, {R});
    return l;
  }
  std::string name() const {
    return fmt::format("{}-bit g{} {} scales [{}, {}]{}", bits, gs, dtype_name(dt), R, C, bias.empty() ? "" : " + bias");
  }
};

struct Shape {
  int64_t R, C;
};
// The next matrix of a sweep over shapes: scales and biases f16 every third case (else bf16), a layer bias every other.
HostAffine next_case(std::mt19937& rng, const Shape& sh, int bits, int gs, int& case_no) {
  const DType dt = (case_no % 3) == 1 ? DType::F16 : DType::BF16;
  const bool with_bias = (case_no++ % 2) == 0;
  return HostAffine(rng, sh.R, sh.C, bits, gs, dt, with_bias);
}

void reference(const HostAffine& a, const std::vector<float>& x, int64_t T, std::vector<float>& y, std::vector<float>& mag) {
  reference_linear(a.w, a.bias, a.R, a.C, x, T, y, mag);
}

Linear upload(CudaBackend& gpu, HostAffine& a) {
  Linear l = gpu.load_linear(a.host_linear());
  gpu.synchronize();
  return l;
}

// Picks the affine GEMV kernel (1 or 2) for a scope, then back to the environment's.
struct GemvVariant {
  explicit GemvVariant(int v) { cuda::set_affine_gemv_variant(v); }
  ~GemvVariant() { cuda::set_affine_gemv_variant(0); }
};
struct XAhead {
  explicit XAhead(int pieces) { cuda::set_affine_v2_x_ahead(pieces); }
  ~XAhead() { cuda::set_affine_v2_x_ahead(-1); }
};
struct StreamIntX {
  explicit StreamIntX(int on) { cuda::set_affine_stream_int_x(on); }
  ~StreamIntX() { cuda::set_affine_stream_int_x(-1); }
};

// Whether v4 takes the shape (4-bit, K a multiple of 1024 up to 16384; one row): only there does its integer x apply.
bool stream_takes(int bits, int64_t C) { return bits == 4 && C % 1024 == 0 && C <= 16384; }

// v4's integer x: every input rounded to a step of max|x| / 32767 over its 32-column piece (half a step at most),
// so an output may differ from the float reference by Σ|w|·max/65534 more; added to mag in units of the
// tolerance's 2e-5.
// (v5: the same with groups of `piece` columns and steps of max|x| / 16256, so half a step is max / 32512.)
void add_int_x_bound(const std::vector<float>& w, int64_t R, int64_t C, const std::vector<float>& x, int64_t T, std::vector<float>& mag,
                     int64_t piece = 32, double half_steps = 65534.0) {
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> m(size_t((C + piece - 1) / piece), 0.0);
    for (int64_t k = 0; k < C; ++k) m[size_t(k / piece)] = std::max(m[size_t(k / piece)], double(std::fabs(x[size_t(t * C + k)])));
    for (int64_t n = 0; n < R; ++n) {
      double b = 0.0;
      for (int64_t k = 0; k < C; ++k) b += std::fabs(double(w[size_t(n * C + k)])) * m[size_t(k / piece)] / half_steps;
      mag[size_t(t * R + n)] += float(b / 2e-5);
    }
  }
}

// The plain v4 kernel's own rounding (bf16 x): per 32-column piece it sums x·(128 + q) in f32 and takes 128·scale·Σx
// back out, so its error scales with 128·|scale|·Σ|x| of each piece, not with Σ|x·w| (an input that dwarfs the rest,
// as real activations have, makes the two far apart): 8 f32 roundings of that (the cancellation is one rounding of the
// piece's scale·S; 8 leaves room for S's own sum), as a magnitude for the 2e-5 tolerance. Without an outlier it adds
// about a third to the tolerance; with one (x[0]·2048) it dominates.
void add_offset_bound(const HostAffine& a, const std::vector<float>& x, int64_t T, std::vector<float>& mag) {
  const int64_t G = a.C / a.gs;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < a.R; ++n) {
      double b = 0.0;
      for (int64_t k = 0; k < a.C; ++k) {
        const uint16_t sv = a.scales[size_t(n * G + k / a.gs)];
        const double s = a.dt == DType::F16 ? f16_to_f32(sv) : bf16_to_f32(sv);
        b += 128.0 * std::fabs(s) * std::fabs(double(x[size_t(t * a.C + k)]));
      }
      mag[size_t(t * a.R + n)] += float(b * 8.0 * std::ldexp(1.0, -24) / 2e-5);
    }
}

// The fused forms at one shape, against the reference: q/k/v (75, 33, 17 rows; q and v with a bias) in one linear_multi
// (bf16 outputs: one fused launch), then gate/up (91 rows; a gate bias at g32, an up bias at g128) with `act` in one
// gated_up. bound(a, x, mag) adds a kernel's own rounding of x to an output's magnitude where it has one.
template <class Bound>
void check_fused_forms(CudaBackend& gpu, std::mt19937& rng, int64_t C, int64_t T, int bits, int gs, DType dt, ActOp act, const std::string& label,
                       Bound&& bound) {
  HostAffine q(rng, 75, C, bits, gs, dt, true), k(rng, 33, C, bits, gs, dt, false), v(rng, 17, C, bits, gs, dt, true);
  const Linear lq = upload(gpu, q), lk = upload(gpu, k), lv = upload(gpu, v);
  std::vector<float> x = random_bf16(rng, size_t(T * C));
  Tensor xd = dev_bf16(gpu, x, {T, C});
  Tensor yq = gpu.alloc(DType::BF16, {T, 75}), yk = gpu.alloc(DType::BF16, {T, 33}), yv = gpu.alloc(DType::BF16, {T, 17});
  const Backend::LinearOut outs[3] = {{&lq, yq}, {&lk, yk}, {&lv, yv}};
  gpu.linear_multi(xd, outs, 3);
  for (auto [a, y] : {std::pair{&q, yq}, std::pair{&k, yk}, std::pair{&v, yv}}) {
    std::vector<float> ref, mag;
    reference(*a, x, T, ref, mag);
    bound(*a, x, mag);
    expect_linear_close(host_f32(gpu, y), ref, mag, true, fmt::format("{} multi {} T={}", label, a->name(), T));
  }
  HostAffine g(rng, 91, C, bits, gs, dt, gs == 32), u(rng, 91, C, bits, gs, dt, gs == 128);
  const Linear lg = upload(gpu, g), lu = upload(gpu, u);
  Tensor gate = gpu.alloc(DType::BF16, {T, 91}), up = gpu.alloc(DType::BF16, {T, 91}), out = gpu.alloc(DType::BF16, {T, 91});
  gpu.gated_up(xd, lg, lu, act, gate, up, out);
  std::vector<float> rg, mg, ru, mu;
  reference(g, x, T, rg, mg), reference(u, x, T, ru, mu);
  bound(g, x, mg), bound(u, x, mu);
  expect_gated_close(host_f32(gpu, out), rg, mg, ru, mu, act, fmt::format("{} gated {} T={}", label, g.name(), T));
}

TEST(CudaAffine, DeviceLayoutKeepsTheFileBytes) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(3);
  for (DType dt : {DType::BF16, DType::F16}) {
    HostAffine a(rng, 5, 96, 3, 32, dt, false);
    const Linear l = upload(gpu, a);
    const cuda::AffineWeights w = cuda::affine_weights(l);
    EXPECT_EQ(w.rows, 5);
    EXPECT_EQ(w.cols, 96);
    EXPECT_EQ(w.bits, 3);
    EXPECT_EQ(w.group_size, 32);
    EXPECT_EQ(w.sb_f16, dt == DType::F16);
    std::vector<uint32_t> codes(a.codes.size()), sb(size_t(5 * 3));
    gpu.download(l.data, codes.data());
    gpu.download(l.scales, sb.data());
    EXPECT_EQ(codes, a.codes);
    for (size_t i = 0; i < sb.size(); ++i) {
      EXPECT_EQ(sb[i] & 0xffffu, a.scales[i]) << i;
      EXPECT_EQ(sb[i] >> 16, a.biases[i]) << i;
    }
  }
  // A dense Linear is not affine: affine_weights says so.
  std::vector<uint16_t> h(64, 0);
  const Linear d = gpu.load_linear(Linear::dense(Tensor(h.data(), DType::BF16, {8, 8})));
  EXPECT_THROW(cuda::affine_weights(d), Error);
}

// Every bits x group size x scale dtype; rows not a multiple of anything; cols a few groups (an odd count of
// 32-column units, so the last 128-code chunk is partial) and a long row (8192 + g: K split over warps,
// x read from global memory at 3 and 8 rows).
TEST(CudaAffine, GemvMatchesTheReferenceEveryBitsAndGroup) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(5);
  int case_no = 0;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int gs : {32, 64, 128})
      for (DType dt : {DType::BF16, DType::F16})
        for (int64_t C : {int64_t(3 * gs), int64_t(8192 + gs)}) {
          const int64_t R = C > 1024 ? 37 : 131;
          const bool with_bias = (case_no++ % 2) == 0;
          HostAffine a(rng, R, C, bits, gs, dt, with_bias);
          const Linear l = upload(gpu, a);
          for (int64_t T : {1, 3, 8}) {  // 9+ rows: affine_linear_test.cpp
            const bool f32 = (T + bits) % 2 == 0;
            check_linear(gpu, l, a.w, a.bias, R, C, T, f32, rng, fmt::format("{} T={} {}", a.name(), T, f32 ? "f32" : "bf16"));
          }
        }
}

TEST(CudaAffine, PickLinearNamesWhatItSupports) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(6);
  HostAffine a(rng, 4, 64, 4, 64, DType::BF16, false);
  Linear l = upload(gpu, a);
  EXPECT_EQ(gpu.pick_linear(l, 1), CudaBackend::LinearKernel::GemvAffine);
  EXPECT_EQ(gpu.pick_linear(l, 8), CudaBackend::LinearKernel::GemvAffine);
  EXPECT_EQ(gpu.pick_linear(l, 32), CudaBackend::LinearKernel::GemvAffine);  // 4-bit: the wide GEMV to 32 rows
  EXPECT_EQ(gpu.pick_linear(l, 33), CudaBackend::LinearKernel::GemmAffine);
  EXPECT_EQ(gpu.pick_linear(l, 4096), CudaBackend::LinearKernel::DequantAffineLt);
  l.bits = 7;
  try {
    gpu.pick_linear(l, 1);
    ADD_FAILURE() << "7-bit weights were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("affine 7-bit g64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2/3/4/5/6/8-bit"), std::string::npos) << e.what();
  }
  // The host format is checked at load: 7 bits, and codes of the wrong shape.
  Linear h = a.host_linear();
  h.bits = 7;
  EXPECT_THROW(gpu.load_linear(h), Error);
  h = a.host_linear();
  h.data.shape[1] = 3;
  EXPECT_THROW(gpu.load_linear(h), Error);
}

// q/k/v in one launch (linear_multi) and gate/up with the activation (gated_up), against the reference.
// (Every GEMV kernel: v1, then v2 and v3 where they apply (2/3/4/8-bit), at every group size for those.)
TEST(CudaAffine, FusedMultiAndGatedMatchTheReference) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(9);
  for (int variant : {1, 2, 3})
  for (int bits : {2, 3, 4, 6, 8})
    for (int gs_pick : {0, 1, 2})
    for (int64_t T : {1, 3, 8}) {
      if (gs_pick > 0 && (variant == 1 || bits == 6)) continue;
      GemvVariant chosen(variant);
      const int gs = gs_pick == 1 ? 32 : gs_pick == 2 ? (bits == 4 ? 128 : 64) : bits == 3 ? 32 : bits == 4 ? 64 : 128;
      const int64_t C = 4 * gs + 128;
      // q/k/v, then gated: out = silu(bf16(x·gᵀ + b)) * bf16(x·uᵀ + b), rounded to bf16.
      check_fused_forms(gpu, rng, C, T, bits, gs, bits % 2 ? DType::F16 : DType::BF16, ActOp::SiLU, fmt::format("v{}", variant),
                        [](const HostAffine&, const std::vector<float>&, std::vector<float>&) {});
    }
}

// The v2 (tensor-core) GEMV, ARBOR_CUDA_AFFINE_GEMV=2's kernel, and v3 (=3, its cp.async ring), against the same reference: 2/3/4/5/6/8-bit
// (v3's ring: 4/8-bit; the chunked widths 2/3/5/6 run v2 under it), every group size, T 1..8, bf16/f16 pairs, shapes that give
// one tile and a partial one, K splits over 1..8 warps, partial last steps (K not a multiple of 256), and a
// matrix with more units than resident blocks (blocks walking several units, units past the end).
TEST(CudaAffine, GemvV2MatchesTheReference) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  // v2 with x loaded 0-2 pieces ahead, v3; the last with an L2 prefetch 5 steps ahead
  for (auto [variant, x_ahead, pf] : {std::tuple{2, 0, 0}, std::tuple{3, 0, 0}, std::tuple{2, 1, 0}, std::tuple{2, 2, 0}, std::tuple{2, 2, 5}}) {
  SCOPED_TRACE(fmt::format("variant {} x ahead {} prefetch {}", variant, x_ahead, pf));
  GemvVariant chosen(variant);
  XAhead ahead(x_ahead);
  cuda::set_affine_v2_prefetch(pf);
  std::mt19937 rng(15);
  int case_no = 0;
  for (int bits : {4, 8, 3, 2, 6, 5})
    for (int gs : {32, 64, 128})
      for (const Shape& sh : {Shape{131, int64_t(3 * gs)}, Shape{37, int64_t(8192 + gs)}, Shape{2000, 2048 + gs}, Shape{9, int64_t(gs)},
                              Shape{77, 2048}}) {  // the last: whole steps (the kernel without the per-piece test against K)
        HostAffine a = next_case(rng, sh, bits, gs, case_no);
        const Linear l = upload(gpu, a);
        for (int64_t T : {1, 2, 3, 5, 8}) {
          if ((sh.R == 2000 || sh.R == 77) && T != 1 && T != 8) continue;
          const bool f32 = (T + bits + gs / 32) % 2 == 0;
          check_linear(gpu, l, a.w, a.bias, sh.R, sh.C, T, f32, rng, fmt::format("v2 {} T={} {}", a.name(), T, f32 ? "f32" : "bf16"));
        }
      }
  // More tiles than resident blocks: g64, 70001 rows x 256 columns (one or two steps a row, no K split).
  for (int bits : {4, 8, 3, 6}) {
    HostAffine a(rng, 70001, 256, bits, 64, DType::BF16, true);
    const Linear l = upload(gpu, a);
    const int64_t T = 3;
    check_linear(gpu, l, a.w, a.bias, 70001, 256, T, true, rng, fmt::format("v2 {} T={}", a.name(), T));
  }
  }
  cuda::set_affine_v2_prefetch(-1);
}

// The wide GEMV (v2 with two or four n-tiles for 9..32 rows of 4/8-bit codes; ARBOR_CUDA_AFFINE_WIDE) against the same reference:
// 4/8-bit, every group size, partial n-tiles (9, 13, 17, 27 rows) and whole ones (16, 32), one tile and a partial one, K
// splits, partial last steps and whole ones, more units than resident blocks; the fused q/k/v and gate/up forms; and
// pick_linear taking it only where it is chosen.
TEST(CudaAffine, GemvWideMatchesTheReference) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  cuda::set_affine_wide_rows(32);
  for (int img : {1, 0}) {  // x through the pre-pass image (opt-in; where K is whole steps), and as it is
  SCOPED_TRACE(fmt::format("wide image {}", img));
  cuda::set_affine_wide_image(img);
  std::mt19937 rng(21);
  int case_no = 0;
  for (int bits : {4, 8})
    for (int gs : {32, 64, 128}) {
      for (const Shape& sh : {Shape{131, int64_t(3 * gs)}, Shape{37, int64_t(8192 + gs)}, Shape{2000, 2048 + gs}, Shape{77, 2048}}) {
        HostAffine a = next_case(rng, sh, bits, gs, case_no);
        const Linear l = upload(gpu, a);
        for (int64_t T : {9, 13, 16, 17, 27, 32}) {
          if (sh.R == 2000 && T != 13 && T != 32) continue;
          EXPECT_EQ(gpu.pick_linear(l, T), CudaBackend::LinearKernel::GemvAffine);
          const bool f32 = (T + bits + gs / 32) % 2 == 0;
          check_linear(gpu, l, a.w, a.bias, sh.R, sh.C, T, f32, rng, fmt::format("wide {} T={} {}", a.name(), T, f32 ? "f32" : "bf16"));
        }
      }
      for (int64_t T : {12, 32})
        check_fused_forms(gpu, rng, 4 * gs + 256, T, bits, gs, gs == 64 ? DType::F16 : DType::BF16, ActOp::SiLU, "wide",
                          [](const HostAffine&, const std::vector<float>&, std::vector<float>&) {});
    }
  // More tiles than resident blocks: g64, 70001 rows x 256 columns (one step a row, no K split).
  for (int bits : {4, 8}) {
    HostAffine a(rng, 70001, 256, bits, 64, DType::BF16, true);
    const Linear l = upload(gpu, a);
    check_linear(gpu, l, a.w, a.bias, 70001, 256, 20, true, rng, fmt::format("wide {} T=20", a.name()));
  }
  }
  cuda::set_affine_wide_image(-1);
  // Not chosen: 3-bit codes, and 4-bit with the wide kernel off, take the GEMM from 9 rows; by default 8-bit codes past 16.
  std::mt19937 rng(22);
  HostAffine a3(rng, 40, 256, 3, 64, DType::BF16, false);
  EXPECT_EQ(gpu.pick_linear(upload(gpu, a3), 9), CudaBackend::LinearKernel::GemmAffine);
  HostAffine a4(rng, 40, 256, 4, 64, DType::BF16, false);
  const Linear l4 = upload(gpu, a4);
  EXPECT_EQ(gpu.pick_linear(l4, 33), CudaBackend::LinearKernel::GemmAffine);
  cuda::set_affine_wide_rows(8);
  EXPECT_EQ(gpu.pick_linear(l4, 9), CudaBackend::LinearKernel::GemmAffine);
  cuda::set_affine_wide_rows(-1);
  if (!std::getenv("ARBOR_CUDA_AFFINE_WIDE")) {
    HostAffine a8(rng, 40, 256, 8, 64, DType::BF16, false);
    const Linear l8 = upload(gpu, a8);
    EXPECT_EQ(gpu.pick_linear(l8, 16), CudaBackend::LinearKernel::GemvAffine);
    EXPECT_EQ(gpu.pick_linear(l8, 17), CudaBackend::LinearKernel::GemmAffine);
    EXPECT_EQ(gpu.pick_linear(l4, 9), CudaBackend::LinearKernel::GemvAffine);
  }
}

// The v4 streaming GEMV (ARBOR_CUDA_AFFINE_GEMV=4: one activation row of 4-bit codes, K a multiple of 1024)
// against the same reference: every group size, bf16/f16 pairs, one row, odd row counts, rows past the
// warps (a warp's ring crossing rows), the largest K it takes, f32 and bf16 outputs; fused q/k/v and
// gate/up; and shapes it does not take (K not a multiple of 1024, 3 rows, 8-bit) falling back to another kernel.
TEST(CudaAffine, GemvStreamMatchesTheReference) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  GemvVariant chosen(4);
  for (int intx : {0, 1}) {
  SCOPED_TRACE(fmt::format("x as {}", intx ? "16-bit integers" : "bf16"));
  StreamIntX mode(intx);
  std::mt19937 rng(21);
  int case_no = 0;
  for (int gs : {32, 64, 128})
    for (const Shape& sh : {Shape{1, 1024}, Shape{37, 3072}, Shape{2000, 4096}, Shape{70001, 1024}, Shape{131, 16384}, Shape{33, 1024 + gs}}) {
      HostAffine a = next_case(rng, sh, 4, gs, case_no);
      const Linear l = upload(gpu, a);
      for (int64_t T : {1, 3}) {
        if (T == 3 && sh.R > 2000) continue;
        const bool f32 = (case_no + T) % 2 == 0;
        std::vector<float> x = random_bf16(rng, size_t(T * sh.C));
        if (case_no % 4 == 0) x[0] *= 2048.0f;  // a piece whose largest input dwarfs the rest (still a bf16)
        Tensor xd = dev_bf16(gpu, x, {T, sh.C});
        Tensor yd = gpu.alloc(f32 ? DType::F32 : DType::BF16, {T, sh.R});
        gpu.linear(xd, l, yd);
        std::vector<float> ref, mag;
        reference_linear(a.w, a.bias, sh.R, sh.C, x, T, ref, mag);
        if (T == 1 && stream_takes(4, sh.C)) intx ? add_int_x_bound(a.w, sh.R, sh.C, x, T, mag) : add_offset_bound(a, x, T, mag);
        expect_linear_close(host_f32(gpu, yd), ref, mag, !f32, fmt::format("v4 {} T={} {}", a.name(), T, f32 ? "f32" : "bf16"));
      }
    }
  for (int bits : {4, 8})
    for (int gs : {32, 64, 128}) {
      const int64_t C = 2048;
      check_fused_forms(gpu, rng, C, 1, bits, gs, gs == 64 ? DType::F16 : DType::BF16, ActOp::GeLUTanh, "v4",
                        [&](const HostAffine& a, const std::vector<float>& x, std::vector<float>& mag) {
                          if (intx && stream_takes(bits, C)) add_int_x_bound(a.w, a.R, C, x, 1, mag);
                        });
    }
  }
}

// v5 (ARBOR_CUDA_AFFINE_GEMV=5: 4-bit codes on integer tensor cores, x as 15-bit integers per group from a pre-pass
// image in the backend's scratch) against the reference with its rounding of x in the bound: every group size, T 1..8,
// bf16/f16 pairs, one tile and a partial one, K splits, partial last steps, an input that dwarfs its group, more tiles
// than resident blocks; fused q/k/v and gate/up.
TEST(CudaAffine, GemvV5MatchesTheReference) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  GemvVariant chosen(5);
  for (int pf : {0, 3}) {
  SCOPED_TRACE(fmt::format("L2 prefetch {} steps ahead", pf));
  cuda::set_affine_v2_prefetch(pf);
  std::mt19937 rng(25);
  int case_no = 0;
  for (int gs : {32, 64, 128})
    for (const Shape& sh : {Shape{131, int64_t(3 * gs)}, Shape{37, int64_t(8192 + gs)}, Shape{2000, 2048 + gs}, Shape{9, int64_t(gs)},
                            Shape{4096, 4096}}) {
      HostAffine a = next_case(rng, sh, 4, gs, case_no);
      const Linear l = upload(gpu, a);
      for (int64_t T : {1, 2, 3, 5, 8}) {
        if (sh.R >= 2000 && T != 1 && T != 8) continue;
        const bool f32 = (T + gs / 32 + case_no) % 2 == 0;
        std::vector<float> x = random_bf16(rng, size_t(T * sh.C));
        if ((case_no + T) % 3 == 0) x[size_t(T - 1) * size_t(sh.C)] *= 2048.0f;  // the last row's first group: one input dwarfs the rest
        Tensor xd = dev_bf16(gpu, x, {T, sh.C});
        Tensor yd = gpu.alloc(f32 ? DType::F32 : DType::BF16, {T, sh.R});
        gpu.linear(xd, l, yd);
        std::vector<float> ref, mag;
        reference_linear(a.w, a.bias, sh.R, sh.C, x, T, ref, mag);
        add_int_x_bound(a.w, sh.R, sh.C, x, T, mag, gs, 32512.0);
        expect_linear_close(host_f32(gpu, yd), ref, mag, !f32, fmt::format("v5 {} T={} {}", a.name(), T, f32 ? "f32" : "bf16"));
      }
    }
  {  // more tiles than resident blocks
    HostAffine a(rng, 70001, 256, 4, 64, DType::BF16, true);
    const Linear l = upload(gpu, a);
    const int64_t T = 3;
    std::vector<float> x = random_bf16(rng, size_t(T * 256));
    Tensor xd = dev_bf16(gpu, x, {T, 256});
    Tensor yd = gpu.alloc(DType::F32, {T, 70001});
    gpu.linear(xd, l, yd);
    std::vector<float> ref, mag;
    reference_linear(a.w, a.bias, 70001, 256, x, T, ref, mag);
    add_int_x_bound(a.w, 70001, 256, x, T, mag, 64, 32512.0);
    expect_linear_close(host_f32(gpu, yd), ref, mag, false, fmt::format("v5 {} T={}", a.name(), T));
  }
  for (int gs : {32, 64, 128})
    for (int64_t T : {1, 4, 8})
      check_fused_forms(gpu, rng, 2048 + gs, T, 4, gs, gs == 64 ? DType::F16 : DType::BF16, ActOp::SiLU, "v5",
                        [&](const HostAffine& a, const std::vector<float>& x, std::vector<float>& mag) {
                          add_int_x_bound(a.w, a.R, a.C, x, T, mag, gs, 32512.0);
                        });
  }
  cuda::set_affine_v2_prefetch(-1);
}

BatchInfo token_batch(std::vector<int32_t> tokens) {
  BatchInfo b;
  b.tokens = std::move(tokens);
  for (size_t i = 0; i < b.tokens.size(); ++i) b.pos.push_back(int32_t(i));
  b.seq.assign(b.tokens.size(), 0);
  b.ctx_len = {int32_t(b.tokens.size())};
  b.max_blocks = 0;
  return b;
}

// The gather dequantizes rows exactly as the reference does (then × scale, rounded to bf16 once).
TEST(CudaAffine, EmbedDequantizesRowsExactly) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(12);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (DType dt : {DType::BF16, DType::F16}) {
      const int gs = bits == 5 ? 128 : bits == 3 ? 32 : 64;
      const int64_t V = 53, C = 3 * gs + (gs == 128 ? 0 : gs);
      HostAffine a(rng, V, C, bits, gs, dt, false);
      const Linear l = upload(gpu, a);
      BatchInfo b = token_batch({3, 0, 52, 3, 17, 41});
      gpu.begin_batch(b);
      Tensor out = gpu.alloc(DType::BF16, {6, C});
      gpu.embed(l, out, 1.5f);
      const std::vector<float> got = host_f32(gpu, out);
      for (size_t t = 0; t < b.tokens.size(); ++t)
        for (int64_t c = 0; c < C; ++c) {
          const float ref = bf16_to_f32(f32_to_bf16(a.w[size_t(b.tokens[t] * C + c)] * 1.5f));
          ASSERT_EQ(got[t * size_t(C) + size_t(c)], ref) << a.name() << " token " << b.tokens[t] << " column " << c;
        }
    }
}

// Whole models: an affine checkpoint (arbor synth --bits B --group-size G's writer) on CUDA against the CPU
// on the same checkpoint, teacher-forced (a prefill chunk of 20 rows: the 8-row slices; then one token per
// step: the GEMV, fused q/k/v and gate/up, decode graphs), untied and tied (the quantized embedding as the
// LM head).
json small_llama(bool tied) {
  return json{{"model_type", "llama"},       {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 300},
              {"hidden_size", 256},          {"intermediate_size", 640},              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},    {"num_key_value_heads", 2},              {"head_dim", 64},
              {"rms_norm_eps", 1e-5},        {"max_position_embeddings", 512},        {"tie_word_embeddings", tied},
              {"rope_theta", 10000.0}};
}

std::string synth_affine(const json& cfg, const std::string& name, const quant::AffineParams& p, DType dt) {
  const fs::path dir = fs::path(testing::TempDir()) / ("arbor_cuda_affine_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  ModelConfig c = parse_model_config(cfg, "test config");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  std::vector<quant::SynthTensor> ts;
  for (const TensorSpec& s : expected_tensors(c, a)) ts.push_back({s.name, s.shape});
  quant::write_affine_synthetic_checkpoint(cfg, ts, dir.string(), dt, p, uint64_t(1) << 30,
                                           [&](const quant::SynthTensor& t, void* dst) { fill_dummy(TensorSpec{t.name, t.shape}, a, dt, dst); });
  return dir.string();
}

std::vector<float> teacher_forced(Model& m, Backend& be, const std::vector<int32_t>& tokens, int64_t prefill) {
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  SequenceKV seq;
  EXPECT_TRUE(seq.reserve(pool, int64_t(tokens.size())));
  const int64_t V = m.config().vocab_size;
  std::vector<float> all, l;
  for (int64_t p0 = 0; p0 < int64_t(tokens.size());) {
    const int64_t n = p0 == 0 ? prefill : 1;
    std::vector<int32_t> chunk(tokens.begin() + p0, tokens.begin() + p0 + n);
    BatchInfo b = make_batch({chunk}, {p0}, {&seq}, true);
    l.resize(size_t(n * V));
    m.forward(b, l.data());
    all.insert(all.end(), l.begin(), l.end());
    seq.length = p0 + n;
    p0 += n;
  }
  seq.release(pool);
  return all;
}

TEST(CudaAffine, AffineCheckpointsMatchTheCpu) {
  ARBOR_REQUIRE_GPU();
  struct Case {
    int bits, gs;
    bool tied;
    DType dt;
  };
  for (const Case& cs : {Case{4, 64, false, DType::BF16}, Case{4, 64, true, DType::BF16}, Case{3, 32, false, DType::F16},
                         Case{8, 128, true, DType::F16}, Case{6, 64, false, DType::BF16}}) {
    const std::string label = fmt::format("{}-bit g{} {} {}", cs.bits, cs.gs, cs.tied ? "tied" : "untied", dtype_name(cs.dt));
    SCOPED_TRACE(label);
    LoadOptions opt;
    opt.model_dir = synth_affine(small_llama(cs.tied), fmt::format("{}_{}_{}_{}", cs.bits, cs.gs, cs.tied, dtype_name(cs.dt)),
                                 {cs.gs, cs.bits}, cs.dt);
    opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
    CpuBackend cpu(2, WeightPlacement::Mapped);
    CudaBackend gpu(0);
    Model mc(opt, cpu), mg(opt, gpu);
    const int64_t V = mc.config().vocab_size;
    std::mt19937 rng(7);
    std::vector<int32_t> tokens(40);
    for (auto& t : tokens) t = int32_t(rng() % uint32_t(V));
    const std::vector<float> rc = teacher_forced(mc, cpu, tokens, 20), rg = teacher_forced(mg, gpu, tokens, 20);
    const float ref = max_abs(rc), diff = max_diff(rg, rc);
    EXPECT_GT(ref, 0.0f);
    EXPECT_LE(diff, 2e-2f * ref) << "max|ref| " << ref;
    int64_t agree = 0;
    for (size_t t = 0; t < tokens.size(); ++t)
      agree += argmax(rc.data() + t * size_t(V), V) == argmax(rg.data() + t * size_t(V), V);
    std::printf("[ %s ] max|Δ| %.3g of max|ref| %.3g (%.2f%%), greedy agreement %lld/%zu\n", label.c_str(), double(diff), double(ref),
                100.0 * double(diff) / double(ref), (long long)agree, tokens.size());
  }
}

}  // namespace

namespace {

// Not a check: the GEMV's bandwidth at Llama-3.1-8B's shapes (what `arbor bench-linear --device cuda` prints),
// for device runs that ship only test_cuda: --gtest_also_run_disabled_tests --gtest_filter=*AffineBandwidth*.
// ARBOR_AFFINE_BENCH="bits:T,T bits:T" picks the cases (default "4:1,2,8 8:1,2,8 3:1"), group size 64.
TEST(CudaAffineBandwidth, DISABLED_At8BShapes) {
  ARBOR_REQUIRE_GPU();
  const char* env = std::getenv("ARBOR_AFFINE_BENCH");
  std::istringstream spec(env ? env : "4:1,2,8 8:1,2,8 3:1");
  const double bw = cuda_measure_copy_bandwidth();
  std::printf("copy bandwidth %.1f GB/s\n%-9s %-14s %4s %3s %9s %8s %8s %7s\n", bw / 1e9, "linear", "N x K", "bits", "T", "MB", "us", "GB/s",
              "of copy");
  struct Matrix {
    const char* name;
    int64_t N, K;
  };
  for (std::string item; spec >> item;) {
    const int bits = std::stoi(item.substr(0, item.find(':')));
    std::vector<int64_t> Ts;
    std::istringstream tl(item.substr(item.find(':') + 1));
    for (std::string t; std::getline(tl, t, ',');) Ts.push_back(std::stoll(t));
    for (const Matrix& s : {Matrix{"q/o", 4096, 4096}, Matrix{"k/v", 1024, 4096}, Matrix{"gate/up", 14336, 4096}, Matrix{"down", 4096, 14336},
                            Matrix{"lm_head", 128256, 4096}})
      for (int64_t T : Ts) {
        const double bytes = cuda::affine_weight_bytes(s.N, s.K, bits, 64), sec = cuda::time_affine_gemv(s.N, s.K, T, bits, 64, 20);
        std::printf("%-9s %6lld x %-5lld %4d %3lld %9.2f %8.2f %8.1f %6.1f%%\n", s.name, (long long)s.N, (long long)s.K, bits, (long long)T,
                    bytes / 1e6, sec * 1e6, bytes / sec / 1e9, 100.0 * bytes / sec / bw);
        std::fflush(stdout);
      }
  }
}

}  // namespace
