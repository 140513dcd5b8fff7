// CUDA ops against the CPU backend on random data: embed, norms, head norms, linear (GEMV and
// cuBLASLt; bf16, f16 and f32 weights; bias; f32 output), rope, activations, residual add,
// softcap, row gather. Shapes include odd sizes. Skipped without a GPU.
#include <tuple>

#include <gtest/gtest.h>

#include "core/error.h"
#include "cuda_test_util.h"

using namespace arbor;
using namespace arbor::cuda_test;

namespace {

BatchInfo token_batch(std::vector<int32_t> tokens, std::vector<int32_t> pos) {
  BatchInfo b;
  b.tokens = std::move(tokens);
  b.pos = std::move(pos);
  b.seq.assign(b.tokens.size(), 0);
  b.ctx_len = {int32_t(b.tokens.size())};
  b.max_blocks = 0;
  return b;
}

TEST(CudaOps, Embed) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(1);
  CudaBackend gpu(0);
  CpuBackend cpu(1, WeightPlacement::Copy);
  for (DType dt : {DType::BF16, DType::F16}) {
    const int64_t V = 37, C = 70;
    std::vector<float> f = random_bf16(rng, size_t(V * C));
    std::vector<uint16_t> h(f.size());
    for (size_t i = 0; i < f.size(); ++i) h[i] = dt == DType::BF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
    Tensor host(h.data(), dt, {V, C});
    const Linear tg = gpu.load_linear(Linear::dense(host)), tc = cpu.load_linear(Linear::dense(host));
    BatchInfo b = token_batch({3, 0, 36, 3, 17}, {0, 1, 2, 3, 4});
    gpu.begin_batch(b), cpu.begin_batch(b);
    Tensor og = gpu.alloc(DType::BF16, {5, C});
    std::vector<float> oc(size_t(5 * C));
    gpu.embed(tg, og, 1.5f);
    cpu.embed(tc, host_view(oc, {5, C}), 1.5f);
    EXPECT_LE(max_diff(host_f32(gpu, og), oc), 1e-2f * max_abs(oc)) << dtype_name(dt);
  }
}

TEST(CudaOps, NormsAllKindsAndShapes) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(2);
  CudaBackend gpu(0);
  CpuBackend cpu(1, WeightPlacement::Copy);
  for (NormOp op : {NormOp::RMS, NormOp::RMSPlusOne, NormOp::LayerNorm})
    for (auto [R, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 7}, {3, 64}, {17, 100}, {2, 4096}, {5, 3000}}) {
      std::vector<float> x = random_bf16(rng, size_t(R * C), 3.0f, 0.5f);
      std::vector<float> w = random_bf16(rng, size_t(C), 0.5f, 1.0f), bias = random_bf16(rng, size_t(C), 0.3f);
      Tensor wg = gpu.load_weight(Tensor(w.data(), DType::F32, {C})), bg = gpu.load_weight(Tensor(bias.data(), DType::F32, {C}));
      Tensor xg = dev_bf16(gpu, x, {R, C}), og = gpu.alloc(DType::BF16, {R, C});
      std::vector<float> oc(x.size());
      Tensor bc = op == NormOp::LayerNorm ? Tensor(bias.data(), DType::F32, {C}) : Tensor{};
      cpu.norm(op, host_view(x, {R, C}), Tensor(w.data(), DType::F32, {C}), bc, 1e-5f, host_view(oc, {R, C}));
      gpu.norm(op, xg, wg, op == NormOp::LayerNorm ? bg : Tensor{}, 1e-5f, og);
      EXPECT_LE(max_diff(host_f32(gpu, og), oc), 1e-2f * max_abs(oc)) << int(op) << " " << R << "x" << C;
      gpu.norm(op, xg, wg, op == NormOp::LayerNorm ? bg : Tensor{}, 1e-5f, xg);  // in place, as the decoder does for q/k
      EXPECT_LE(max_diff(host_f32(gpu, xg), oc), 1e-2f * max_abs(oc)) << "in place " << int(op) << " " << R << "x" << C;
    }
}

TEST(CudaOps, HeadNorm) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(3);
  CudaBackend gpu(0);
  CpuBackend cpu(1, WeightPlacement::Copy);
  for (int64_t hd : {64, 128, 256}) {
    const int64_t T = 5, H = 3;
    std::vector<float> x = random_bf16(rng, size_t(T * H * hd), 2.0f), w = random_bf16(rng, size_t(hd), 0.5f, 1.0f);
    Tensor xg = dev_bf16(gpu, x, {T, H * hd});
    gpu.head_norm(NormOp::RMS, xg, hd, gpu.load_weight(Tensor(w.data(), DType::F32, {hd})), 1e-6f);
    cpu.head_norm(NormOp::RMS, host_view(x, {T, H * hd}), hd, Tensor(w.data(), DType::F32, {hd}), 1e-6f);
    EXPECT_LE(max_diff(host_f32(gpu, xg), x), 1e-2f * max_abs(x)) << hd;
  }
}

// GEMV (T <= 8) and cuBLASLt (T > 8) against the CPU's linear, for every weight dtype, with and
// without bias, into bf16 activations and into f32 (the logits buffer).
TEST(CudaOps, LinearEveryPathDtypeAndShape) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(4);
  CudaBackend gpu(0);
  CpuBackend cpu(2, WeightPlacement::Copy);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{17, 40},   {64, 64},   {130, 264}, {96, 37},
                                                           {1000, 512}, {3, 1024}, {2113, 256}, {37, 768}};
  // GEMV for every row count it takes (up to 8; at 1-2 rows with K % 256 == 0 the streaming kernel,
  // then the register kernel), then cuBLASLt for the small ones too.
  for (int mode : {0, 1, 2})
  for (auto [N, K] : shapes)
    for (int64_t T : {1, 2, 3, 5, 8, 9, 33})
      for (DType wt : {DType::BF16, DType::F16, DType::F32})
        for (bool with_bias : {false, true})
          for (DType yt : {DType::BF16, DType::F32}) {
            if ((T > 2 && T < 8) && (wt != DType::BF16 || yt != DType::BF16)) continue;  // keep the matrix small
            const int64_t gemv_rows = mode == 2 ? 0 : 8;
            if (gemv_rows == 0 && T > 8) continue;
            if (mode == 1 && (T > 2 || K % 256 != 0)) continue;  // the register kernel where streaming would run
            gpu.set_gemv_max_rows(gemv_rows);
            CudaBackend::set_gemv_stream(mode == 0);
            std::vector<float> wf = random_bf16(rng, size_t(N * K), 1.0f / std::sqrt(float(K)) * 2);
            std::vector<uint16_t> w16(wf.size());
            if (wt == DType::F16)
              for (size_t i = 0; i < wf.size(); ++i) w16[i] = f32_to_f16(wf[i]);
            if (wt == DType::BF16) w16 = to_bf16(wf);
            if (wt == DType::F32)  // not bf16-exact: the GPU rounds at upload
              for (auto& v : wf) v += 1e-4f;
            Tensor wh = wt == DType::F32 ? Tensor(wf.data(), DType::F32, {N, K}) : Tensor(w16.data(), wt, {N, K});
            std::vector<float> bias = random_bf16(rng, size_t(N), 0.5f);
            Linear lg, lc;
            lg = gpu.load_linear(Linear::dense(wh)), lc = cpu.load_linear(Linear::dense(wh));
            if (with_bias) lg.bias = gpu.load_weight(Tensor(bias.data(), DType::F32, {N})), lc.bias = Tensor(bias.data(), DType::F32, {N});
            std::vector<float> x = random_bf16(rng, size_t(T * K));
            Tensor xg = dev_bf16(gpu, x, {T, K}), yg = gpu.alloc(yt, {T, N});
            std::vector<float> yc(size_t(T * N));
            gpu.linear(xg, lg, yg);
            cpu.linear(host_view(x, {T, K}), lc, host_view(yc, {T, N}));
            EXPECT_LE(max_diff(host_f32(gpu, yg), yc), 1e-2f * max_abs(yc))
                << "mode " << mode << " N " << N << " K " << K << " T " << T << " w " << dtype_name(wt) << " bias " << with_bias << " y " << dtype_name(yt);
          }
  CudaBackend::set_gemv_stream(true);
}

// The tensor-core GEMV (3-8 rows, bf16 weights, K % 512 == 0) at decode-like shapes: row counts that
// leave a row group partly filled, K slices of 1 to 28 stages per warp, more row groups than blocks, x
// in shared memory (T x K x 2 <= 64 KB) and not; the same numbers with it off (the register kernel)
// as a second check.
TEST(CudaOps, TensorCoreGemvShapes) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(41);
  CudaBackend gpu(0);
  CpuBackend cpu(2, WeightPlacement::Copy);
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{1, 512}, {4101, 4096}, {515, 14336}, {40000, 512}, {77, 512}, {300, 8192}})
    for (int64_t T : {3, 4, 6, 7, 8}) {
      if (N * K > (int64_t(1) << 24) && T != 8 && T != 3) continue;  // the big ones at two row counts
      SCOPED_TRACE(::testing::Message() << "N " << N << " K " << K << " T " << T);
      CudaBackend::set_gemv_mma(true);
      ASSERT_TRUE(CudaBackend::gemv_mma_takes(T, K, DType::BF16));
      std::vector<float> wf = random_bf16(rng, size_t(N * K), 1.0f / std::sqrt(float(K)) * 2);
      std::vector<uint16_t> w16 = to_bf16(wf);
      std::vector<float> bias = random_bf16(rng, size_t(N), 0.5f);
      Linear lg, lc;
      const Tensor wh(w16.data(), DType::BF16, {N, K});
      lg = gpu.load_linear(Linear::dense(wh)), lc = cpu.load_linear(Linear::dense(wh));
      const bool with_bias = (N + T) % 2 == 1;
      if (with_bias) lg.bias = gpu.load_weight(Tensor(bias.data(), DType::F32, {N})), lc.bias = Tensor(bias.data(), DType::F32, {N});
      std::vector<float> x = random_bf16(rng, size_t(T * K));
      Tensor xg = dev_bf16(gpu, x, {T, K});
      std::vector<float> yc(size_t(T * N));
      cpu.linear(host_view(x, {T, K}), lc, host_view(yc, {T, N}));
      for (bool mma : {true, false})  // tensor cores, then the register kernel
        for (DType yt : {DType::BF16, DType::F32}) {
          CudaBackend::set_gemv_mma(mma);
          gpu.set_gemv_max_rows(mma ? 2 : 8);  // the default rule; or every row count on the register kernel
          Tensor yg = gpu.alloc(yt, {T, N});
          gpu.linear(xg, lg, yg);
          EXPECT_LE(max_diff(host_f32(gpu, yg), yc), 1e-2f * max_abs(yc)) << "y " << dtype_name(yt) << " tensor-core gemv " << mma;
        }
    }
  CudaBackend::set_gemv_mma(true);  // the default
}

TEST(CudaOps, RopeFullAndPartial) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(5);
  CudaBackend gpu(0);
  CpuBackend cpu(1, WeightPlacement::Copy);
  for (auto [hd, rot] : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {128, 64}, {256, 256}}) {
    const int64_t T = 6, H = 3, P = 50;
    std::vector<float> cs(size_t(P * rot / 2)), sn(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(0.37f * float(i)), sn[i] = std::sin(0.37f * float(i));
    std::vector<float> x = random_bf16(rng, size_t(T * H * hd));
    BatchInfo b = token_batch({1, 2, 3, 4, 5, 6}, {0, 49, 7, 8, 20, 3});
    gpu.begin_batch(b), cpu.begin_batch(b);
    Tensor xg = dev_bf16(gpu, x, {T, H * hd});
    gpu.rope(xg, H, hd, rot, gpu.upload_table(cs, {P, rot / 2}), gpu.upload_table(sn, {P, rot / 2}));
    cpu.rope(host_view(x, {T, H * hd}), H, hd, rot, Tensor(cs.data(), DType::F32, {P, rot / 2}), Tensor(sn.data(), DType::F32, {P, rot / 2}));
    EXPECT_LE(max_diff(host_f32(gpu, xg), x), 1e-2f * max_abs(x)) << hd << "/" << rot;
  }
  // Table rows other than the positions (BatchInfo::rope_rows: a longrope sequence in the long regime
  // reads row ctx + position), head_dims of the generic attention path, a partial rotary.
  for (auto [hd, rot] : std::vector<std::pair<int64_t, int64_t>>{{24, 24}, {40, 30}, {112, 112}}) {
    const int64_t T = 5, H = 2, P = 50;
    std::vector<float> cs(size_t(2 * P * rot / 2)), sn(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(0.29f * float(i)), sn[i] = std::sin(0.29f * float(i));
    std::vector<float> x = random_bf16(rng, size_t(T * H * hd));
    BatchInfo b = token_batch({1, 2, 3, 4, 5}, {0, 49, 7, 8, 20});
    b.rope_rows = {0, 99, 7, 58, 70};
    gpu.begin_batch(b), cpu.begin_batch(b);
    Tensor xg = dev_bf16(gpu, x, {T, H * hd});
    gpu.rope(xg, H, hd, rot, gpu.upload_table(cs, {2 * P, rot / 2}), gpu.upload_table(sn, {2 * P, rot / 2}));
    cpu.rope(host_view(x, {T, H * hd}), H, hd, rot, Tensor(cs.data(), DType::F32, {2 * P, rot / 2}),
             Tensor(sn.data(), DType::F32, {2 * P, rot / 2}));
    EXPECT_LE(max_diff(host_f32(gpu, xg), x), 1e-2f * max_abs(x)) << hd << "/" << rot << " with rope rows";
  }
}

TEST(CudaOps, ActivationsResidualSoftcapGather) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(6);
  CudaBackend gpu(0);
  CpuBackend cpu(1, WeightPlacement::Copy);
  const int64_t R = 7, C = 301;
  // Activations: 16-byte vectors with a scalar tail (7 x 301), whole vectors (3 x 4096), fewer
  // elements than one vector (1 x 5), and a view 2 bytes off alignment (the scalar kernel).
  for (auto [ar, ac, off] : {std::tuple<int64_t, int64_t, int64_t>{7, 301, 0}, {3, 4096, 0}, {1, 5, 0}, {3, 37, 1}}) {
    std::vector<float> g = random_bf16(rng, size_t(ar * ac + off), 4.0f), u = random_bf16(rng, size_t(ar * ac + off), 2.0f);
    Tensor gg = dev_bf16(gpu, g, {ar * ac + off}), ug = dev_bf16(gpu, u, {ar * ac + off}), og = gpu.alloc(DType::BF16, {ar * ac + off});
    const auto view = [&](Tensor t) { return Tensor(static_cast<uint16_t*>(t.data) + off, DType::BF16, {ar, ac}, Device::CUDA); };
    g.erase(g.begin(), g.begin() + off), u.erase(u.begin(), u.begin() + off);
    for (ActOp op : {ActOp::SiLU, ActOp::GeLU, ActOp::GeLUTanh})
      for (bool gated : {true, false}) {
        std::vector<float> oc(g.size());
        gpu.activation(op, gated ? view(gg) : Tensor{}, view(ug), view(og));
        cpu.activation(op, gated ? host_view(g, {ar, ac}) : Tensor{}, host_view(u, {ar, ac}), host_view(oc, {ar, ac}));
        std::vector<float> got = host_f32(gpu, og);
        got.erase(got.begin(), got.begin() + off);
        EXPECT_LE(max_diff(got, oc), 1e-2f * max_abs(oc)) << int(op) << " gated " << gated << " " << ar << "x" << ac << "+" << off;
      }
  }
  for (float scale : {1.0f, 0.7f}) {
    std::vector<float> y = random_bf16(rng, size_t(R * C)), x = random_bf16(rng, size_t(R * C));
    Tensor yg = dev_bf16(gpu, y, {R, C}), xg = dev_bf16(gpu, x, {R, C});
    gpu.add_scaled(yg, xg, scale);
    cpu.add_scaled(host_view(y, {R, C}), host_view(x, {R, C}), scale);
    EXPECT_LE(max_diff(host_f32(gpu, yg), y), 1e-2f * max_abs(y)) << scale;
  }
  for (DType dt : {DType::F32, DType::BF16})
    for (float cap : {0.0f, 30.0f}) {
      std::vector<float> x = random_bf16(rng, size_t(R * C), 80.0f);
      Tensor xg = dt == DType::BF16 ? dev_bf16(gpu, x, {R, C}) : gpu.alloc(DType::F32, {R, C});
      if (dt == DType::F32) gpu.upload(x.data(), xg);
      gpu.scale_softcap(xg, 0.5f, cap);
      cpu.scale_softcap(host_view(x, {R, C}), 0.5f, cap);
      EXPECT_LE(max_diff(host_f32(gpu, xg), x), 1e-2f * max_abs(x)) << dtype_name(dt) << " cap " << cap;
    }
  BatchInfo b;
  b.logit_rows = {3, 0, 6, 3};
  gpu.begin_batch(b), cpu.begin_batch(b);
  std::vector<float> x = random_bf16(rng, size_t(R * C)), oc(size_t(4 * C));
  Tensor xg = dev_bf16(gpu, x, {R, C}), rg = gpu.alloc(DType::BF16, {4, C});
  gpu.gather_logit_rows(xg, rg);
  cpu.gather_logit_rows(host_view(x, {R, C}), host_view(oc, {4, C}));
  EXPECT_EQ(max_diff(host_f32(gpu, rg), oc), 0.0f);
}

TEST(CudaOps, ErrorsNameTheProblem) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::vector<double> d(4);
  try {
    gpu.load_weight(Tensor(d.data(), DType::F64, {2, 2}));
    FAIL() << "F64 weight accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("F64"), std::string::npos) << e.what();
  }
  {  // a format without a kernel: the pick and the load name it and what is supported
    std::vector<uint16_t> w(64 * 64);
    Linear q = Linear::dense(Tensor(w.data(), DType::BF16, {64, 64}));
    q.format = WeightFormat::Affine, q.bits = 4, q.group_size = 64;
    for (int64_t rows : {1, 64}) {
      try {
        gpu.pick_linear(q, rows);
        FAIL() << "affine weights picked a kernel";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("affine 4-bit g64"), std::string::npos) << m;
        EXPECT_NE(m.find("supported: dense BF16 or F16"), std::string::npos) << m;
      }
    }
    EXPECT_THROW(gpu.load_linear(q), Error);
  }
  KVLayout kv;
  kv.n_layers = 1, kv.n_blocks = 2, kv.n_kv_heads = 1, kv.head_dim = 80;
  EXPECT_NO_THROW(gpu.alloc_kv(kv));  // the generic attention kernel takes it
  kv.head_dim = 520;
  try {
    gpu.alloc_kv(kv);
    FAIL() << "head_dim 520 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 520"), std::string::npos) << e.what();
  }
}

}  // namespace
