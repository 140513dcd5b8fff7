// Trellis weights on CUDA (trellis.h, trellis_gemv.cu) against the host reference (quant::trellis_decode_linear,
// then a double matmul): the GEMV on random code words (every bit stream is a valid code) for k 2/3/4, both
// axes, odd shapes (rows and, on axis 0, inputs not a multiple of anything; K split over warps; axis 0 split
// over blocks), T 1/3/5/8, bias, f32 and bf16 outputs; the decode to bf16 (launch_trellis_decode) bit for bit
// and the prefill path past 8 rows (decoded slices + cuBLASLt); the device layout (incl. the k = 3 axis-0
// interleaved file layout); the load gate; and whole synth trellis checkpoints, CUDA against the CPU. The
// bandwidth test at Llama-3.1-8B's shapes is disabled (run it by name). Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <tuple>

#include "backend/cuda/trellis.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "engine/generate.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/weights.h"
#include "quant/trellis.h"
#include "quant/trellis_convert.h"

using namespace arbor;
using namespace arbor::cuda_test;
namespace fs = std::filesystem;

namespace {

// A random trellis matrix [out, in] on the host (random words, f16 scales around 0.02) and its reference decode.
struct HostTrellis {
  int64_t out, in;
  int k, axis;
  int64_t R, C;  // stored: coded rows x coded cols
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales;
  std::vector<float> bias;  // [out] or empty
  std::vector<float> w;     // decoded [out, in]

  HostTrellis(std::mt19937& rng, int64_t o, int64_t i, int kk, int ax, bool with_bias) : out(o), in(i), k(kk), axis(ax) {
    R = axis == 1 ? out : in, C = axis == 1 ? in : out;
    words.resize(size_t(R * C * k / 32));
    for (auto& v : words) v = uint32_t(rng());
    std::uniform_real_distribution<float> u(0.01f, 0.03f);
    for (int64_t r = 0; r < R; ++r) scales.push_back(f32_to_f16(u(rng)));
    if (with_bias) bias = random_bf16(rng, size_t(out), 0.5f);
    quant::TrellisGeometry g;
    g.params = {k, 12, 256}, g.axis = axis, g.rows = R, g.cols = C, g.in_features = in, g.out_features = out;
    w = quant::trellis_decode_linear(g, words.data(), scales.data());
  }
  Linear host_linear() {
    Linear l;
    l.format = WeightFormat::Trellis, l.n_rows = out, l.n_cols = in, l.bits = k, l.group_size = 256, l.axis = axis;
    l.data = Tensor(words.data(), DType::U32, {R, C * k / 32});
    l.scales = Tensor(scales.data(), DType::F16, {R});
    if (!bias.empty()) l.bias = Tensor(bias.data(), DType::F32, {out});
    return l;
  }
  std::string name() const { return fmt::format("k={} axis {} [{}, {}]{}", k, axis, out, in, bias.empty() ? "" : " + bias"); }
};

TEST(CudaTrellis, DeviceLayoutIsThePlainWordsAndF32Scales) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(3);
  // Axis 1 as stored; axis 0 k = 3 from the interleaved file layout [out/512, in, 48], de-interleaved at load.
  for (const auto& [k, axis, interleave] : {std::tuple{2, 1, false}, std::tuple{3, 0, true}, std::tuple{4, 0, false}}) {
    const int64_t out = axis == 1 ? 77 : 512, in = axis == 1 ? 512 : 77;
    HostTrellis a(rng, out, in, k, axis, false);
    Linear h = a.host_linear();
    std::vector<uint32_t> inter;
    if (interleave) {
      inter = quant::trellis_interleave_k3(a.words.data(), a.R, a.C);
      h.data = Tensor(inter.data(), DType::U32, {a.C / 512, a.R, 48});
    }
    const Linear l = gpu.load_linear(h);
    gpu.synchronize();
    const cuda::TrellisWeights w = cuda::trellis_weights(l);
    EXPECT_EQ(w.rows, out);
    EXPECT_EQ(w.cols, in);
    EXPECT_EQ(w.bits, k);
    EXPECT_EQ(w.axis, axis);
    std::vector<uint32_t> words(a.words.size());
    std::vector<float> sc(size_t(a.R));
    gpu.download(l.data, words.data());
    gpu.download(l.scales, sc.data());
    EXPECT_EQ(words, a.words) << a.name();
    for (int64_t r = 0; r < a.R; ++r) EXPECT_EQ(sc[size_t(r)], f16_to_f32(a.scales[size_t(r)])) << r;
  }
  std::vector<uint16_t> h(64, 0);
  const Linear d = gpu.load_linear(Linear::dense(Tensor(h.data(), DType::BF16, {8, 8})));
  EXPECT_THROW(cuda::trellis_weights(d), Error);
}

// k 2/3/4 x both axes x shapes: axis 1 [odd out, 256 | 768 | 2048 | 4352 | 8192 in] (4352: 17 blocks, K split over warps at
// few rows; 8192: 16 rows of x do not fit the integer kernel); axis 0 [256 | 768 out, odd in] (1601 inputs: split over
// blocks, the partials reduced). T 1/3/5/8/12/16 (the GEMV's rows: four n-tiles past 8).
// Picks the GEMV kernels for a scope (0: the FP32 ones; 1: the integer tensor-core ones as they run by default;
// 2 and 3: those with the other variants, so that every variant runs: 2 shift-and-mask windows, 32-row tiles, x
// staged per CTA; 3 32-row tiles where they fill the SMs, the pre-pass at every row count, 16-warp CTAs at 9..16 rows, the
// 64-register instances where 16-row tiles run at 1-4 rows), then back to the
// environment's choice.
struct MmaOn {
  explicit MmaOn(int mode) {
    cuda::set_trellis_gemv_mma(mode == 0 ? 0 : 1);
    if (mode == 2) cuda::set_trellis_gemv_options(0, 0, 0);  // the other instruction mix, 32-row tiles, x staged per CTA
    if (mode == 3) cuda::set_trellis_gemv_options(1, 1, 2, 1, 1);  // 32-row tiles where they fill the SMs, the pre-pass at 1 row, 16-warp CTAs past 8 rows, 64-register instances
  }
  ~MmaOn() { cuda::set_trellis_gemv_mma(-1), cuda::set_trellis_gemv_options(-1, -1, -1, -1, -1); }
};
const char* kernel_name(int mode) {
  return mode == 0   ? "fp32 kernels"
         : mode == 1 ? "integer tensor-core kernels (defaults)"
         : mode == 2 ? "integer tensor-core kernels: shift-and-mask windows, 32-row tiles, no pre-pass"
                     : "integer tensor-core kernels: 32-row tiles where they fill the SMs, pre-pass at every row count, 64-register instances";
}

// One GEMV case as check_linear, with the integer kernels' own error on top of its tolerance: they take x (axis 0:
// x·scale/std) as integers of 15 bits against the largest of its group, so each output may be off by Σ|y|·max/32512,
// which on the host's numbers is at most Σ_i |w_i| · max_i (|x_i|·scale_i) / min_i scale_i / 32512 (bound per row).
void check_trellis_linear(CudaBackend& gpu, const Linear& l, const HostTrellis& a, int64_t T, bool f32_out, bool integer, std::mt19937& rng,
                          const std::string& what) {
  std::vector<float> x = random_bf16(rng, size_t(T * a.in));
  Tensor xd = dev_bf16(gpu, x, {T, a.in});
  Tensor yd = gpu.alloc(f32_out ? DType::F32 : DType::BF16, {T, a.out});
  gpu.linear(xd, l, yd);
  std::vector<float> ref, mag;
  reference_linear(a.w, a.bias, a.out, a.in, x, T, ref, mag);
  if (integer) {
    float smin = 1e30f, smax = 0.0f;
    for (uint16_t h : a.scales) smin = std::min(smin, f16_to_f32(h)), smax = std::max(smax, f16_to_f32(h));
    const float ratio = a.axis == 0 ? smax / smin : 1.0f;
    for (int64_t t = 0; t < T; ++t) {
      float xm = 0.0f;
      for (int64_t i = 0; i < a.in; ++i) xm = std::max(xm, std::fabs(x[size_t(t * a.in + i)]));
      for (int64_t n = 0; n < a.out; ++n) {
        double wsum = 0;
        for (int64_t i = 0; i < a.in; ++i) wsum += std::fabs(a.w[size_t(n * a.in + i)]);
        // expect_linear_close allows 2e-5·mag: widen mag so that its allowance covers the quantization too.
        mag[size_t(t * a.out + n)] += float(wsum * xm * ratio / 32512.0 / 2e-5);
      }
    }
  }
  expect_linear_close(host_f32(gpu, yd), ref, mag, !f32_out, what);
}

// Both kernel families of each axis (the FP32 ones; trellis_imma_kernel / trellis_imma_axis0_kernel).
TEST(CudaTrellis, GemvMatchesTheReference) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  for (int mode : {0, 1, 2, 3}) {
  SCOPED_TRACE(kernel_name(mode));
  MmaOn chosen(mode);
  std::mt19937 rng(5);
  struct Shape {
    int axis;
    int64_t out, in;
  };
  int case_no = 0;
  for (int k : {2, 3, 4})
    for (const Shape& s : {Shape{1, 131, 256}, Shape{1, 37, 4352}, Shape{1, 5, 768}, Shape{1, 300, 2048}, Shape{1, 9, 8192}, Shape{1, 21, 14336}, Shape{0, 256, 77},
                           Shape{0, 768, 1601}, Shape{0, 512, 3}}) {
      const bool with_bias = (case_no++ % 2) == 0;
      HostTrellis a(rng, s.out, s.in, k, s.axis, with_bias);
      const Linear l = gpu.load_linear(a.host_linear());
      // 17+ rows: PrefillMatchesTheReference. [9, 8192] at 12 and 16 rows, [21, 14336] (a down projection's inputs on
      // axis 1) past 5 rows: x past the integer kernel's shared memory,
      // so the FP32 kernels in launches of 8 rows (also every shape in mode 0).
      for (int64_t T : {1, 3, 5, 8, 12, 16}) {
        const bool f32 = (T + k) % 2 == 0;
        check_trellis_linear(gpu, l, a, T, f32, mode != 0, rng, fmt::format("{} T={} {}", a.name(), T, f32 ? "f32" : "bf16"));
      }
    }
  }
}

// The integer tensor-core kernels stage x (axis 0: x times the row scale) as integers scaled per group: activations
// far outside f16's range (1e6) and far below it (1e-7) come out as the FP32 reference says, on both axes (axis 0
// [256 out, 1000 in]: its rows split over blocks, each with its own groups).
TEST(CudaTrellis, TensorCoreKernelTakesAnyActivationScale) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  for (int mode : {1, 2, 3}) {
  SCOPED_TRACE(kernel_name(mode));
  MmaOn chosen(mode);
  std::mt19937 rng(11);
  for (int axis : {1, 0})
    for (float mag : {1e6f, 1e-7f})
      for (int64_t T : {1, 4, 16}) {
        const int64_t out = axis == 1 ? 70 : 256, in = axis == 1 ? 1024 : 1000;
        HostTrellis a(rng, out, in, 3, axis, false);
        const Linear l = gpu.load_linear(a.host_linear());
        std::vector<float> x = random_bf16(rng, size_t(T * in));
        for (auto& v : x) v = bf16_to_f32(f32_to_bf16(v * mag));
        Tensor xd = dev_bf16(gpu, x, {T, in});
        Tensor yd = gpu.alloc(DType::F32, {T, out});
        gpu.linear(xd, l, yd);
        std::vector<float> ref, m;
        reference_linear(a.w, a.bias, a.out, a.in, x, T, ref, m);
        expect_linear_close(host_f32(gpu, yd), ref, m, false, fmt::format("axis {} |x| ~ {} T={}", axis, mag, T));
      }
  }
}

// q/k/v in one launch (linear_multi) and gate/up with the activation (gated_up) on axis-1 matrices, against the
// reference; and a set that does not fuse (an axis-0 matrix among them), which runs one GEMV each.
TEST(CudaTrellis, FusedMultiAndGatedMatchTheReference) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  for (int mode : {0, 1, 2, 3}) {
  SCOPED_TRACE(kernel_name(mode));
  MmaOn chosen(mode);
  std::mt19937 rng(7);
  for (int k : {2, 3, 4})
    for (int64_t T : {1, 3, 8, 13}) {
      const int64_t C = T == 3 ? 4352 : 768;
      // T = 8: v on axis 0 (its rows a multiple of 256), so the three do not fuse and run one GEMV each.
      const int64_t vrows = T == 8 ? 256 : 33;
      HostTrellis q(rng, 75, C, k, 1, true), kk(rng, 33, C, k, 1, false), v(rng, vrows, C, k, T == 8 ? 0 : 1, true);
      const Linear lq = gpu.load_linear(q.host_linear()), lk = gpu.load_linear(kk.host_linear()), lv = gpu.load_linear(v.host_linear());
      std::vector<float> x = random_bf16(rng, size_t(T * C));
      Tensor xd = dev_bf16(gpu, x, {T, C});
      Tensor yq = gpu.alloc(DType::BF16, {T, 75}), yk = gpu.alloc(DType::BF16, {T, 33}), yv = gpu.alloc(DType::BF16, {T, vrows});
      const Backend::LinearOut outs[3] = {{&lq, yq}, {&lk, yk}, {&lv, yv}};
      gpu.linear_multi(xd, outs, 3);
      for (auto [a, y] : {std::pair{&q, yq}, std::pair{&kk, yk}, std::pair{&v, yv}}) {
        std::vector<float> ref, mag;
        reference_linear(a->w, a->bias, a->out, a->in, x, T, ref, mag);
        expect_linear_close(host_f32(gpu, y), ref, mag, true, fmt::format("multi {} T={}", a->name(), T));
      }
      for (ActOp act : {ActOp::SiLU, ActOp::GeLUTanh}) {
        HostTrellis g(rng, 91, C, k, 1, act == ActOp::SiLU), u(rng, 91, C, k, 1, false);
        const Linear lg = gpu.load_linear(g.host_linear()), lu = gpu.load_linear(u.host_linear());
        Tensor gate = gpu.alloc(DType::BF16, {T, 91}), up = gpu.alloc(DType::BF16, {T, 91}), out = gpu.alloc(DType::BF16, {T, 91});
        gpu.gated_up(xd, lg, lu, act, gate, up, out);
        std::vector<float> rg, mg, ru, mu;
        reference_linear(g.w, g.bias, g.out, g.in, x, T, rg, mg), reference_linear(u.w, u.bias, u.out, u.in, x, T, ru, mu);
        expect_gated_close(host_f32(gpu, out), rg, mg, ru, mu, act, fmt::format("gated {} T={}", g.name(), T));
      }
    }
  }
}

// launch_trellis_decode: rows of W as bf16, bit for bit the host decode rounded to bf16 (the same f32
// arithmetic), for k 2/3/4, both axes, a slice from the middle, odd input counts on axis 0.
TEST(CudaTrellis, DecodeIsTheReferenceRoundedToBf16) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(8);
  struct Shape {
    int axis;
    int64_t out, in, row0, n;
  };
  for (int k : {2, 3, 4})
    for (const Shape& s : {Shape{1, 300, 512, 0, 300}, Shape{1, 37, 768, 5, 29}, Shape{0, 768, 77, 256, 512}, Shape{0, 256, 1601, 0, 256}}) {
      HostTrellis a(rng, s.out, s.in, k, s.axis, false);
      const Linear l = gpu.load_linear(a.host_linear());
      Tensor out = gpu.alloc(DType::BF16, {s.n, s.in});
      gpu.synchronize();
      cuda::launch_trellis_decode(cuda::trellis_weights(l), s.row0, s.n, out.as<uint16_t>(), gpu.sm_count(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = host_f32(gpu, out);
      int bad = 0;
      for (int64_t r = 0; r < s.n; ++r)
        for (int64_t c = 0; c < s.in; ++c) {
          const float want = bf16_to_f32(f32_to_bf16(a.w[size_t((s.row0 + r) * s.in + c)]));
          if (got[size_t(r * s.in + c)] != want && bad++ < 5)
            ADD_FAILURE() << a.name() << ": row " << s.row0 + r << " col " << c << " is " << got[size_t(r * s.in + c)] << ", want " << want;
        }
      EXPECT_EQ(bad, 0) << a.name();
    }
  // Slices the layout cannot take fail naming them: axis 0 not on a 256-output boundary.
  HostTrellis a(rng, 512, 64, 2, 0, false);
  const Linear l = gpu.load_linear(a.host_linear());
  Tensor out = gpu.alloc(DType::BF16, {256, 64});
  EXPECT_THROW(cuda::launch_trellis_decode(cuda::trellis_weights(l), 128, 256, out.as<uint16_t>(), gpu.sm_count(), nullptr), Error);
}

// CudaBackend::linear past the GEMV's rows: W decoded slice by slice (forced small: several slices and a
// partial last one on axis 1) and cuBLASLt, against the host decode rounded to bf16 and a float64 matmul;
// both axes, bias and none, bf16 and f32 outputs.
TEST(CudaTrellis, PrefillMatchesTheReference) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(9);
  int case_no = 0;
  struct Shape {
    int axis;
    int64_t out, in;
  };
  for (int k : {2, 3, 4})
    for (const Shape& s : {Shape{1, 600, 512}, Shape{0, 768, 77}, Shape{0, 512, 1601}})
      for (int64_t T : {17, 40, 130}) {
        const bool with_bias = case_no % 2 == 0, f32 = case_no % 3 == 0;
        ++case_no;
        gpu.set_affine_dequant(65, size_t(256) * 2 * size_t(s.in));  // slices of 256 rows
        gpu.set_dq_streams(1 + (case_no / 4) % 2);                       // on one stream, or two
        HostTrellis a(rng, s.out, s.in, k, s.axis, with_bias);
        const Linear l = gpu.load_linear(a.host_linear());
        ASSERT_EQ(gpu.pick_linear(l, T), CudaBackend::LinearKernel::DequantTrellisLt);
        std::vector<float> x = random_bf16(rng, size_t(T * s.in));
        Tensor xd = dev_bf16(gpu, x, {T, s.in});
        Tensor yd = gpu.alloc(f32 ? DType::F32 : DType::BF16, {T, s.out});
        gpu.linear(xd, l, yd);
        const std::vector<float> y = host_f32(gpu, yd);
        int bad = 0;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = 0; r < s.out; ++r) {
            double p = 0.0, mag = 0.0;
            for (int64_t c = 0; c < s.in; ++c) {
              const double v = double(x[size_t(t * s.in + c)]) * bf16_to_f32(f32_to_bf16(a.w[size_t(r * s.in + c)]));
              p += v, mag += std::fabs(v);
            }
            // bf16 output: cuBLASLt rounds the product, then the bias is added and rounded again.
            const double b = with_bias ? a.bias[size_t(r)] : 0.0, sum = p + b;
            const double tol = 1e-5 * mag + (f32 ? 0.0 : std::ldexp(std::fabs(p) + std::fabs(sum), -8)) + 1e-6;
            const float got = y[size_t(t * s.out + r)];
            if (!(std::fabs(got - sum) <= tol) && ++bad <= 5)
              ADD_FAILURE() << a.name() << " T=" << T << ": y[" << t << "][" << r << "] = " << got << ", reference " << sum;
          }
        EXPECT_EQ(bad, 0) << a.name() << " T=" << T;
      }
}

TEST(CudaTrellis, PickLinearTakesEveryRowCount) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(6);
  HostTrellis a(rng, 8, 256, 2, 1, false);
  const Linear l = gpu.load_linear(a.host_linear());
  for (int64_t rows : {1, 8, 16}) EXPECT_EQ(gpu.pick_linear(l, rows), CudaBackend::LinearKernel::GemvTrellis);
  for (int64_t rows : {17, 2048}) EXPECT_EQ(gpu.pick_linear(l, rows), CudaBackend::LinearKernel::DequantTrellisLt);
  // The host format is checked at load: words of the wrong width, k 5.
  Linear h = a.host_linear();
  h.data.shape[1] = 15;
  EXPECT_THROW(gpu.load_linear(h), Error);
  h = a.host_linear();
  h.bits = 5;
  EXPECT_THROW(gpu.load_linear(h), Error);
}

// Whole models: a synth trellis checkpoint (arbor synth --format trellis's writer and recipe) on CUDA against the
// CPU on the same checkpoint, teacher-forced (a prefill chunk of 20 rows: the 8-row slices; then one token per
// step: the GEMV through linear_multi / gated_up's unfused forms and the decode graphs).
json small_llama() {
  return json{{"model_type", "llama"},       {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 300},
              {"hidden_size", 512},          {"intermediate_size", 768},              {"num_hidden_layers", 2},
              {"num_attention_heads", 8},    {"num_key_value_heads", 4},              {"head_dim", 64},
              {"rms_norm_eps", 1e-5},        {"max_position_embeddings", 512},        {"tie_word_embeddings", false},
              {"rope_theta", 10000.0}};
}

std::string synth_trellis(const json& cfg, int k, int down_axis) {
  const fs::path dir = fs::path(testing::TempDir()) / fmt::format("arbor_cuda_trellis_{}_{}", k, down_axis);
  fs::remove_all(dir);
  fs::create_directories(dir);
  ModelConfig c = parse_model_config(cfg, "test config");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  std::vector<quant::TrellisSynthTensor> ts;
  for (const TensorSpec& s : expected_tensors(c, a)) ts.push_back({s.name, s.shape});
  quant::write_trellis_synthetic_checkpoint(cfg, ts, dir.string(), DType::BF16, trellis_arch_recipe(a, k, down_axis), uint64_t(1) << 30,
                                            [&](const quant::TrellisSynthTensor& t, void* dst) {
                                              fill_dummy(TensorSpec{t.name, t.shape}, a, DType::BF16, dst);
                                            });
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

int64_t argmax_of(const float* v, int64_t n) { return int64_t(std::max_element(v, v + n) - v); }

TEST(CudaTrellis, TrellisCheckpointsMatchTheCpu) {
  ARBOR_REQUIRE_GPU();
  for (const auto& [k, down_axis] : {std::pair{2, 0}, std::pair{3, 0}, std::pair{4, 0}, std::pair{3, 1}}) {
    const std::string label = fmt::format("k={} down axis {}", k, down_axis);
    SCOPED_TRACE(label);
    LoadOptions opt;
    opt.model_dir = synth_trellis(small_llama(), k, down_axis);
    opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
    CpuBackend cpu(2, WeightPlacement::Mapped);
    CudaBackend gpu(0);
    Model mc(opt, cpu), mg(opt, gpu);
    EXPECT_NE(mg.weight_formats().find(fmt::format("trellis {}-bit", k)), std::string::npos) << mg.weight_formats();
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
      agree += argmax_of(rc.data() + t * size_t(V), V) == argmax_of(rg.data() + t * size_t(V), V);
    std::printf("[ %s ] max|Δ| %.3g of max|ref| %.3g (%.2f%%), greedy agreement %lld/%zu\n", label.c_str(), double(diff), double(ref),
                100.0 * double(diff) / double(ref), (long long)agree, tokens.size());
  }
}

// Not a check: the GEMV's bandwidth at Llama-3.1-8B's shapes (what `arbor bench-linear --device cuda --format
// trellis` prints), for device runs that ship only test_cuda: --gtest_also_run_disabled_tests
// --gtest_filter=*TrellisBandwidth*. ARBOR_TRELLIS_BENCH="k:T,T k:T" picks the cases (default "2:1,8 3:1 4:1");
// the down projection on axis 0, the rest on axis 1.
TEST(CudaTrellisBandwidth, DISABLED_At8BShapes) {
  ARBOR_REQUIRE_GPU();
  const char* env = std::getenv("ARBOR_TRELLIS_BENCH");
  std::istringstream spec(env ? env : "2:1,8 3:1 4:1");
  const double bw = cuda_measure_copy_bandwidth();
  std::printf("copy bandwidth %.1f GB/s\n%-9s %-14s %4s %2s %3s %9s %8s %8s %7s\n", bw / 1e9, "linear", "N x K", "k", "ax", "T", "MB", "us",
              "GB/s", "of copy");
  struct Shape {
    const char* name;
    int64_t N, K;
    int axis;
  };
  for (std::string item; spec >> item;) {
    const int k = std::stoi(item.substr(0, item.find(':')));
    std::vector<int64_t> Ts;
    std::istringstream tl(item.substr(item.find(':') + 1));
    for (std::string t; std::getline(tl, t, ',');) Ts.push_back(std::stoll(t));
    double total_bytes = 0, total_sec = 0;  // one decoder layer (q, k, v, o, gate, up, down) at T = Ts[0]
    for (const Shape& s : {Shape{"q/o", 4096, 4096, 1}, Shape{"k/v", 1024, 4096, 1}, Shape{"gate/up", 14336, 4096, 1},
                           Shape{"down", 4096, 14336, 0}, Shape{"down ax1", 4096, 14336, 1}})
      for (int64_t T : Ts) {
        const double bytes = cuda::trellis_weight_bytes(s.N, s.K, k, s.axis), sec = cuda::time_trellis_gemv(s.N, s.K, T, k, s.axis, 20);
        std::printf("%-9s %6lld x %-5lld %4d %2d %3lld %9.2f %8.2f %8.1f %6.1f%%\n", s.name, (long long)s.N, (long long)s.K, k, s.axis,
                    (long long)T, bytes / 1e6, sec * 1e6, bytes / sec / 1e9, 100.0 * bytes / sec / bw);
        std::fflush(stdout);
        if (T == Ts[0] && std::string(s.name) != "down ax1") {
          const double times = std::string(s.name) == "q/o" || std::string(s.name) == "k/v" || std::string(s.name) == "gate/up" ? 2 : 1;
          total_bytes += times * bytes, total_sec += times * sec;
        }
      }
    std::printf("k=%d one layer at T=%lld: %.2f MB in %.2f us, %.1f%% of copy bandwidth\n", k, (long long)Ts[0], total_bytes / 1e6,
                total_sec * 1e6, 100.0 * total_bytes / total_sec / bw);
  }
}

}  // namespace
