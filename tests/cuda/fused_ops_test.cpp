// The CUDA backend's fused ops against the unfused op sequence they replace (each of which is tested
// against the CPU in ops_test / attention_test): q/k prep (per-head norms + rope + KV write), the
// gated GEMV (gate and up projections + activation), the residual add fused with a norm, the
// multi-matrix GEMV (q/k/v in one launch), and the q/k prep inside decode attention. Random data, odd
// shapes. Skipped without a GPU.
#include <utility>

#include <gtest/gtest.h>

#include "core/error.h"
#include "cuda_test_util.h"

using namespace arbor;
using namespace arbor::cuda_test;

namespace {

Linear dev_linear(CudaBackend& gpu, std::mt19937& rng, int64_t N, int64_t K, bool bias, std::vector<std::vector<float>>& keep) {
  keep.push_back(random_bf16(rng, size_t(N * K), 0.1f));
  std::vector<uint16_t> h = to_bf16(keep.back());
  Linear l = gpu.load_linear(Linear::dense(Tensor(h.data(), DType::BF16, {N, K})));
  if (bias) {
    keep.push_back(random_bf16(rng, size_t(N), 0.5f));
    l.bias = gpu.load_weight(Tensor(keep.back().data(), DType::F32, {N}));
  }
  gpu.synchronize();  // the staging buffers are reused
  return l;
}

// Rope tables [n_pos, rot / 2] (cos, sin) with base 10000.
std::pair<std::vector<float>, std::vector<float>> rope_tables(int64_t rot, int64_t n_pos) {
  const int64_t half = rot / 2;
  std::vector<float> c(size_t(n_pos * half)), s(c.size());
  for (int64_t p = 0; p < n_pos; ++p)
    for (int64_t j = 0; j < half; ++j) {
      const double th = double(p) * std::pow(10000.0, -2.0 * double(j) / double(rot));
      c[size_t(p * half + j)] = float(std::cos(th)), s[size_t(p * half + j)] = float(std::sin(th));
    }
  return {c, s};
}

// A q/k prep test case: head_dim, q and kv heads, rotated dims; per-head norms ((1 + w) with
// plus_one), rope; for the tests with attention, its softcap and window.
struct PrepCase {
  int64_t D, Hq, Hkv, rot;
  bool norm, plus_one, rope;
  float softcap = 0.0f;
  int64_t window = 0;
};

// A case's prep on backend g: the norm weight nw (shared by q and k) and rope tables of n_pos
// positions uploaded, and the QKPrep pointing at them.
struct PrepOnDevice {
  Tensor w, c, s;
  Backend::QKPrep p;
  PrepOnDevice(CudaBackend& g, const PrepCase& cs, std::vector<float>& nw, int64_t n_pos) {
    const auto [cosv, sinv] = rope_tables(cs.rot, n_pos);
    w = g.load_weight(Tensor(nw.data(), DType::F32, {cs.D}));
    c = g.upload_table(cosv, {n_pos, cs.rot / 2}), s = g.upload_table(sinv, {n_pos, cs.rot / 2});
    p.norm = cs.plus_one ? NormOp::RMSPlusOne : NormOp::RMS, p.eps = 1e-6f;
    p.n_heads = cs.Hq, p.n_kv_heads = cs.Hkv, p.head_dim = cs.D, p.rot_dim = cs.rot;
    if (cs.norm) p.q_norm = &w, p.k_norm = &w;
    if (cs.rope) p.cos = &c, p.sin = &s;
  }
  PrepOnDevice(const PrepOnDevice&) = delete;  // p points into this object
};

TEST(CudaFused, GatedGemvMatchesLinearThenActivation) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(21);
  CudaBackend gpu(0);
  gpu.set_gemv_max_rows(8);  // the fused GEMV at every row count it takes
  std::vector<std::vector<float>> keep;
  for (bool mma : {false, true})  // 3-8 rows: the register kernel, then the tensor-core one (K % 512 == 0)
  for (ActOp op : {ActOp::SiLU, ActOp::GeLU, ActOp::GeLUTanh})
    for (auto [T, N, K] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 37, 64}, {3, 256, 200}, {8, 1000, 512}, {5, 3, 4096}, {1, 2500, 512}, {2, 300, 1024}, {4, 70, 16384}}) {
      // (1, 2500, 512) and (2, 300, 1024) take the streaming kernel (K % 256 == 0, at most 2 rows);
      // (4, 70, 16384): x too large for shared memory in the wide-stage kernel.
      SCOPED_TRACE(::testing::Message() << "act " << int(op) << " T " << T << " N " << N << " K " << K << " mma " << mma);
      CudaBackend::set_gemv_mma(mma);
      const bool bias = K == 200 || K == 1024;
      Linear g = dev_linear(gpu, rng, N, K, bias, keep), u = dev_linear(gpu, rng, N, K, bias, keep);
      Tensor x = dev_bf16(gpu, random_bf16(rng, size_t(T * K)), {T, K});
      Tensor gate = gpu.alloc(DType::BF16, {T, N}), up = gpu.alloc(DType::BF16, {T, N});
      Tensor fused = gpu.alloc(DType::BF16, {T, N}), ref = gpu.alloc(DType::BF16, {T, N});
      gpu.gated_up(x, g, u, op, gate, up, fused);
      gpu.linear(x, g, gate);
      gpu.linear(x, u, up);
      gpu.activation(op, gate, up, ref);
      const auto a = host_f32(gpu, fused), b = host_f32(gpu, ref);
      EXPECT_LE(max_diff(a, b), 1e-2f * max_abs(b) + 1e-6f);
    }
  CudaBackend::set_gemv_mma(true);  // the default
}

TEST(CudaFused, MultiGemvMatchesSeparateLinears) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(22);
  CudaBackend gpu(0);
  gpu.set_gemv_max_rows(8);
  std::vector<std::vector<float>> keep;
  // K 512 / 1024 at 1-2 rows: the streaming kernel, whose warps' row runs cross matrix boundaries.
  for (bool mma : {false, true})  // 3-8 rows: the register kernel, then the tensor-core one (K % 512 == 0)
  for (auto [T, K] : std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {2, 72}, {7, 4096}, {8, 100}, {1, 512}, {2, 1024}}) {
    SCOPED_TRACE(::testing::Message() << "T " << T << " K " << K << " mma " << mma);
    CudaBackend::set_gemv_mma(mma);
    const int64_t Ns[3] = {K >= 1024 ? 2048 : 96, K >= 1024 ? 513 : 33, 33};
    Linear l[3];
    Tensor y[3], r[3];
    for (int i = 0; i < 3; ++i) {
      l[i] = dev_linear(gpu, rng, Ns[i], K, i == 1, keep);
      y[i] = gpu.alloc(DType::BF16, {T, Ns[i]}), r[i] = gpu.alloc(DType::BF16, {T, Ns[i]});
    }
    Tensor x = dev_bf16(gpu, random_bf16(rng, size_t(T * K)), {T, K});
    const Backend::LinearOut outs[3] = {{&l[0], y[0]}, {&l[1], y[1]}, {&l[2], y[2]}};
    gpu.linear_multi(x, outs, 3);
    for (int i = 0; i < 3; ++i) {
      gpu.linear(x, l[i], r[i]);
      // The K split may differ (it follows the launch's total rows), so the sums' order may too.
      const auto a = host_f32(gpu, y[i]), e = host_f32(gpu, r[i]);
      EXPECT_LE(max_diff(a, e), 1e-2f * max_abs(e)) << "matrix " << i;
    }
  }
  CudaBackend::set_gemv_mma(true);  // the default
}

TEST(CudaFused, AddNormMatchesAddThenNorm) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(23);
  CudaBackend gpu(0);
  for (NormOp op : {NormOp::RMS, NormOp::RMSPlusOne, NormOp::LayerNorm})
    for (auto [R, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 7}, {5, 100}, {3, 4096}}) {
      std::vector<float> x = random_bf16(rng, size_t(R * C), 2.0f), o = random_bf16(rng, size_t(R * C), 1.0f);
      std::vector<float> w = random_bf16(rng, size_t(C), 0.5f, 1.0f), bias = random_bf16(rng, size_t(C), 0.3f);
      Tensor wg = gpu.load_weight(Tensor(w.data(), DType::F32, {C})), bg = gpu.load_weight(Tensor(bias.data(), DType::F32, {C}));
      Tensor x1 = dev_bf16(gpu, x, {R, C}), x2 = dev_bf16(gpu, x, {R, C}), og = dev_bf16(gpu, o, {R, C});
      Tensor h1 = gpu.alloc(DType::BF16, {R, C}), h2 = gpu.alloc(DType::BF16, {R, C});
      const Tensor b = op == NormOp::LayerNorm ? bg : Tensor{};
      gpu.add_norm(op, x1, og, 0.7f, wg, b, 1e-5f, h1);
      gpu.add_scaled(x2, og, 0.7f);
      gpu.norm(op, x2, wg, b, 1e-5f, h2);
      EXPECT_EQ(host_f32(gpu, x1), host_f32(gpu, x2));
      EXPECT_EQ(host_f32(gpu, h1), host_f32(gpu, h2));
    }
}

// q/k prep against head_norm + rope + kv_write on the same paged batch: q, k and both KV pools.
TEST(CudaFused, QKPrepMatchesNormRopeKVWrite) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(24);
  for (PrepCase cs : std::vector<PrepCase>{{64, 4, 2, 64, true, false, true},
                                   {128, 8, 1, 128, false, false, true},
                                   {256, 2, 1, 256, true, true, true},
                                   {96, 3, 3, 72, false, false, true},
                                   {32, 5, 1, 24, true, false, true},
                                   {64, 2, 2, 64, true, false, false},
                                   {128, 4, 2, 64, true, false, true},     // partial rope, halves of 32 (16-byte kernel)
                                   {32, 3, 1, 32, false, false, true}}) {  // 4 lanes per row, rows past the end
    SCOPED_TRACE(::testing::Message() << "D " << cs.D << " heads " << cs.Hq << "/" << cs.Hkv << " rot " << cs.rot);
    int64_t n_blocks = 0;
    BatchInfo b = paged_batch({40, 17, 5}, {3, 17, 1}, 16, rng, &n_blocks);
    const int64_t T = b.n_tokens();
    KVLayout kv;
    kv.n_layers = 1, kv.n_blocks = n_blocks, kv.block_size = 16, kv.n_kv_heads = cs.Hkv, kv.head_dim = cs.D;
    CudaBackend a(0), r(0);
    a.alloc_kv(kv), r.alloc_kv(kv);
    std::vector<float> q = random_bf16(rng, size_t(T * cs.Hq * cs.D)), k = random_bf16(rng, size_t(T * cs.Hkv * cs.D));
    std::vector<float> v = random_bf16(rng, size_t(T * cs.Hkv * cs.D)), nw = random_bf16(rng, size_t(cs.D), 0.5f, cs.plus_one ? 0.0f : 1.0f);
    auto run = [&](CudaBackend& g, bool fused) {
      g.begin_batch(b);
      Tensor qd = dev_bf16(g, q, {T, cs.Hq * cs.D}), kd = dev_bf16(g, k, {T, cs.Hkv * cs.D}), vd = dev_bf16(g, v, {T, cs.Hkv * cs.D});
      const PrepOnDevice prep(g, cs, nw, 64);
      if (fused) g.qk_prep_kv_write(0, qd, kd, vd, prep.p);
      else g.Backend::qk_prep_kv_write(0, qd, kd, vd, prep.p);  // the separate ops
      return std::vector<std::vector<float>>{host_f32(g, qd), host_f32(g, kd), host_f32(g, g.k_pool(0)), host_f32(g, g.v_pool(0))};
    };
    auto fa = run(a, true), ra = run(r, false);
    const char* names[4] = {"q", "k", "k pool", "v pool"};
    for (int i = 0; i < 4; ++i) EXPECT_LE(max_diff(fa[size_t(i)], ra[size_t(i)]), 1e-2f * max_abs(ra[size_t(i)])) << names[i];
  }
}

// prep_attention with the q/k prep inside the decode-attention kernel against qk_prep_kv_write then
// attention (set_fused_prep(false)), one token per sequence: the outputs and both KV pools.
TEST(CudaFused, PrepInDecodeAttentionMatchesPrepThenAttention) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(25);
  for (PrepCase cs : std::vector<PrepCase>{{128, 8, 2, 128, false, false, true, 0.0f, 0},   // Llama: rope only, 4 heads per block
                                   {128, 16, 8, 128, true, false, true, 0.0f, 0},  // Qwen3: per-head norms, 2 heads per block
                                   {64, 16, 1, 32, true, true, true, 30.0f, 0},    // partial rope, (1 + w), softcap, 2 head chunks
                                   {256, 4, 2, 256, true, true, true, 0.0f, 37},   // Gemma-like, sliding window
                                   {32, 4, 4, 32, false, false, true, 0.0f, 0},
                                   {64, 6, 3, 64, false, false, false, 0.0f, 0}}) {  // no rope on this layer
    SCOPED_TRACE(::testing::Message() << "D " << cs.D << " heads " << cs.Hq << "/" << cs.Hkv << " rot " << cs.rot << " window " << cs.window);
    const std::vector<int32_t> ctx = {1, 40, 17, 300, 16};
    int64_t n_blocks = 0;
    BatchInfo fill = paged_batch(ctx, ctx, 16, rng, &n_blocks);
    std::mt19937 rng_copy = rng;
    BatchInfo query = paged_batch(ctx, std::vector<int32_t>(ctx.size(), 1), 16, rng_copy, &n_blocks);
    query.block_tables = fill.block_tables;
    const int64_t TF = fill.n_tokens(), T = query.n_tokens(), kv_row = cs.Hkv * cs.D, q_row = cs.Hq * cs.D;
    KVLayout kv;
    kv.n_layers = 1, kv.n_blocks = n_blocks, kv.block_size = 16, kv.n_kv_heads = cs.Hkv, kv.head_dim = cs.D;
    std::vector<float> kf = random_bf16(rng, size_t(TF * kv_row)), vf = random_bf16(rng, size_t(TF * kv_row));
    std::vector<float> q = random_bf16(rng, size_t(T * q_row)), k = random_bf16(rng, size_t(T * kv_row)), v = random_bf16(rng, size_t(T * kv_row));
    std::vector<float> nw = random_bf16(rng, size_t(cs.D), 0.5f, cs.plus_one ? 0.0f : 1.0f);
    auto run = [&](bool fused) {
      CudaBackend g(0);
      g.set_fused_prep(fused);
      g.alloc_kv(kv);
      g.begin_batch(fill);
      g.kv_write(0, dev_bf16(g, kf, {TF, kv_row}), dev_bf16(g, vf, {TF, kv_row}));
      g.begin_batch(query);
      Tensor qd = dev_bf16(g, q, {T, q_row}), kd = dev_bf16(g, k, {T, kv_row}), vd = dev_bf16(g, v, {T, kv_row});
      Tensor out = g.alloc(DType::BF16, {T, q_row});
      const PrepOnDevice prep(g, cs, nw, 512);
      AttentionParams ap;
      ap.n_heads = cs.Hq, ap.n_kv_heads = cs.Hkv, ap.head_dim = cs.D, ap.scale = 1.0f / std::sqrt(float(cs.D));
      ap.softcap = cs.softcap, ap.window = cs.window;
      g.prep_attention(0, qd, kd, vd, prep.p, ap, out);
      return std::vector<std::vector<float>>{host_f32(g, out), host_f32(g, g.k_pool(0)), host_f32(g, g.v_pool(0))};
    };
    auto fa = run(true), ra = run(false);
    const char* names[3] = {"out", "k pool", "v pool"};
    for (int i = 0; i < 3; ++i) EXPECT_LE(max_diff(fa[size_t(i)], ra[size_t(i)]), 1e-2f * max_abs(ra[size_t(i)])) << names[i];
  }
}

}  // namespace
