// KV-cache codecs on CUDA (attention_kv.cu, kv_rows.h, the q/k prep's fused encode) against
// quant/kv_codec's scalar reference: the codes and scales written by kv_write and by the fused q/k prep
// are byte-identical to kv_encode_row's on the same bf16 inputs; decode attention (split-K over the
// codes), the prefill path (coded blocks dequantized for the bf16 kernels) and the generic kernel
// match "decode the pool's rows with kv_decode_row, then attend in double" at head_dim 64/128/256, GQA
// 1/4/8, block boundaries, contexts over many pages, sliding windows and softcap; and whole synthetic
// models with each codec match the CPU with the same codec. Skipped without a GPU.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/json.h"
#include "cuda_test_util.h"
#include "engine/generate.h"
#include "model/synth.h"
#include "quant/kv_codec.h"
#include "backend/cuda/kv_mma_layout.h"

using namespace arbor;
using namespace arbor::cuda_test;
namespace fs = std::filesystem;

namespace {

const char* const kCodecs[] = {"affine8", "affine4", "k8v4", "k8v3", "affine3", "k4v2", "k6v4", "affine2"};

std::vector<uint8_t> host_bytes(CudaBackend& be, const Tensor& t) {
  std::vector<uint8_t> h(size_t(t.nbytes()));
  be.download(t, h.data());
  return h;
}

int64_t slot_of(const BatchInfo& b, int64_t t, int64_t bs) {
  const int32_t s = b.seq[size_t(t)], p = b.pos[size_t(t)];
  return int64_t(b.block_tables[size_t(s * b.max_blocks + p / bs)]) * bs + p % bs;
}

// Rows with the awkward cases among random ones: zeros, constant groups, tiny and large magnitudes,
// all-negative groups (per row r of n_rows, head_dim values each).
std::vector<float> awkward_rows(std::mt19937& rng, int64_t n_rows, int64_t hd) {
  std::vector<float> v = random_bf16(rng, size_t(n_rows * hd));
  for (int64_t r = 0; r < n_rows; ++r) {
    float* x = v.data() + r * hd;
    switch (r % 7) {
      case 1: std::fill(x, x + hd, 0.0f); break;
      case 2: std::fill(x, x + hd / 2, bf16_to_f32(f32_to_bf16(0.3125f))); break;  // constant groups
      case 3:
        for (int64_t i = 0; i < hd; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i] * 1e-3f));
        break;
      case 4:
        for (int64_t i = 0; i < hd; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i] * 300.0f));
        break;
      case 5:
        for (int64_t i = 0; i < hd; ++i) x[i] = bf16_to_f32(f32_to_bf16(-std::fabs(x[i]) - 2.0f));
        break;
      default: break;
    }
  }
  return v;
}

// Every written row of the GPU's coded pools against kv_encode_row of the row it was given.
void expect_rows_encoded(CudaBackend& gpu, const KVCodecPair& c, const BatchInfo& b, const std::vector<float>& k, const std::vector<float>& v,
                         int64_t H, int64_t hd, int64_t bs, const std::string& what) {
  const std::vector<uint8_t> kp = host_bytes(gpu, gpu.k_pool(0)), vp = host_bytes(gpu, gpu.v_pool(0));
  const int64_t kb = c.k.row_bytes(hd, 2), vb = c.v.row_bytes(hd, 2);
  std::vector<uint8_t> ref(size_t(std::max(kb, vb)));
  int64_t bad_k = 0, bad_v = 0;
  std::string first;
  for (int64_t t = 0; t < b.n_tokens(); ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t row = slot_of(b, t, bs) * H + h;
      kv_encode_row(c.k, k.data() + (t * H + h) * hd, hd, ref.data());
      if (std::memcmp(ref.data(), kp.data() + row * kb, size_t(kb)) != 0) {
        ++bad_k;
        if (first.empty()) first = fmt::format("K token {} head {}", t, h);
      }
      kv_encode_row(c.v, v.data() + (t * H + h) * hd, hd, ref.data());
      if (std::memcmp(ref.data(), vp.data() + row * vb, size_t(vb)) != 0) {
        ++bad_v;
        if (first.empty()) first = fmt::format("V token {} head {}", t, h);
      }
    }
  EXPECT_EQ(bad_k, 0) << what << ": K rows differing from kv_encode_row (first: " << first << ")";
  EXPECT_EQ(bad_v, 0) << what << ": V rows differing from kv_encode_row (first: " << first << ")";
}

TEST(CudaKVCodec, KvWriteEncodesBitIdenticallyToTheReference) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(3);
  for (int64_t hd : {64, 128, 256})
    for (const char* name : kCodecs) {
      const std::string what = fmt::format("{} head_dim {}", name, hd);
      SCOPED_TRACE(what);
      const int64_t H = 3, bs = 16;
      int64_t n_blocks = 0;
      BatchInfo b = paged_batch({37, 5}, {37, 5}, bs, rng, &n_blocks);
      KVLayout kv;
      kv.n_layers = 1, kv.n_blocks = n_blocks, kv.block_size = bs, kv.n_kv_heads = H, kv.head_dim = hd;
      kv.codecs = {parse_kv_codec(name)};
      CudaBackend gpu(0);
      gpu.alloc_kv(kv);
      const int64_t T = b.n_tokens();
      std::vector<float> k = awkward_rows(rng, T * H, hd), v = awkward_rows(rng, T * H, hd);
      gpu.begin_batch(b);
      gpu.kv_write(0, dev_bf16(gpu, k, {T, H * hd}), dev_bf16(gpu, v, {T, H * hd}));
      expect_rows_encoded(gpu, kv.codecs[0], b, k, v, H, hd, bs, what + " kv_write");
    }
}

// The q/k prep kernel (norm + rope) with the encode fused: the prepared keys it leaves in k, encoded by
// the reference, are the pool's rows. Rope on whole 8-dim lanes (the vectorised kernel) and on 6 dims
// (the scalar kernel, then the coded KV write).
TEST(CudaKVCodec, FusedQkPrepEncodesBitIdenticallyToTheReference) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (int64_t hd : {64, 128, 256})
    for (const char* name : {"affine8", "affine4", "k8v4", "k8v3", "k4v2"})
      for (int64_t rot : {hd, int64_t(12)}) {
        const std::string what = fmt::format("{} head_dim {} rot {}", name, hd, rot);
        SCOPED_TRACE(what);
        const int64_t H = 2, NQ = 8, bs = 16;
        int64_t n_blocks = 0;
        BatchInfo b = paged_batch({21, 3, 40}, {21, 1, 1}, bs, rng, &n_blocks);
        KVLayout kv;
        kv.n_layers = 1, kv.n_blocks = n_blocks, kv.block_size = bs, kv.n_kv_heads = H, kv.head_dim = hd;
        kv.codecs = {parse_kv_codec(name)};
        CudaBackend gpu(0);
        gpu.alloc_kv(kv);
        const int64_t T = b.n_tokens();
        std::vector<float> q = random_bf16(rng, size_t(T * NQ * hd)), k = awkward_rows(rng, T * H, hd), v = awkward_rows(rng, T * H, hd);
        std::vector<float> cs(size_t(64 * rot / 2)), sn(cs.size()), nw = random_bf16(rng, size_t(hd), 0.5f, 1.0f);
        for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(0.01f * float(i)), sn[i] = std::sin(0.01f * float(i));
        Tensor cos_t = gpu.upload_table(cs, {64, rot / 2}), sin_t = gpu.upload_table(sn, {64, rot / 2});
        Tensor qn = gpu.upload_table(nw, {hd}), kn = gpu.upload_table(nw, {hd});
        Backend::QKPrep p;
        p.norm = NormOp::RMS, p.q_norm = &qn, p.k_norm = &kn, p.eps = 1e-5f, p.n_heads = NQ, p.n_kv_heads = H, p.head_dim = hd,
        p.rot_dim = rot, p.cos = &cos_t, p.sin = &sin_t;
        gpu.begin_batch(b);
        Tensor qd = dev_bf16(gpu, q, {T, NQ * hd}), kd = dev_bf16(gpu, k, {T, H * hd}), vd = dev_bf16(gpu, v, {T, H * hd});
        gpu.qk_prep_kv_write(0, qd, kd, vd, p);
        expect_rows_encoded(gpu, kv.codecs[0], b, host_f32(gpu, kd), v, H, hd, bs, what + " qk prep");
      }
}

struct Case {
  int64_t head_dim, n_heads, n_kv_heads, window;
  float softcap;
  std::vector<int32_t> ctx, n_query;
};

// Attention over the coded cache: the reference decodes the GPU pool's rows (kv_decode_row) and attends
// in double, so only the attention kernels are under test here.
void run_attention(const char* codec, const Case& c, CudaBackend::AttentionPath path, std::mt19937& rng) {
  std::string what = fmt::format("{} hd {} heads {}/{} window {} softcap {} path {} ctx", codec, c.head_dim, c.n_heads, c.n_kv_heads, c.window,
                                 c.softcap, int(path));
  for (size_t i = 0; i < c.ctx.size(); ++i) what += fmt::format(" {}({})", c.ctx[i], c.n_query[i]);
  SCOPED_TRACE(what);
  const int64_t hd = c.head_dim, H = c.n_kv_heads, bs = 16, q_row = c.n_heads * hd;
  int64_t n_blocks = 0;
  BatchInfo fill = paged_batch(c.ctx, c.ctx, bs, rng, &n_blocks);
  std::mt19937 rng_copy = rng;
  BatchInfo query = paged_batch(c.ctx, c.n_query, bs, rng_copy, &n_blocks);
  query.block_tables = fill.block_tables;
  KVLayout kv;
  kv.n_layers = 1, kv.n_blocks = n_blocks, kv.block_size = bs, kv.n_kv_heads = H, kv.head_dim = hd;
  const KVCodecPair cp = parse_kv_codec(codec);
  kv.codecs = {cp};
  CudaBackend gpu(0);
  gpu.alloc_kv(kv);
  const int64_t TF = fill.n_tokens();
  std::vector<float> k = random_bf16(rng, size_t(TF * H * hd)), v = random_bf16(rng, size_t(TF * H * hd));
  gpu.begin_batch(fill);
  gpu.kv_write(0, dev_bf16(gpu, k, {TF, H * hd}), dev_bf16(gpu, v, {TF, H * hd}));
  // The pool's rows, decoded by the reference, by (sequence, position).
  const std::vector<uint8_t> kp = host_bytes(gpu, gpu.k_pool(0)), vp = host_bytes(gpu, gpu.v_pool(0));
  const int64_t kb = cp.k.row_bytes(hd, 2), vb = cp.v.row_bytes(hd, 2);
  auto row_of = [&](int32_t seq, int32_t pos, int64_t h) {
    return (int64_t(fill.block_tables[size_t(seq * fill.max_blocks + pos / bs)]) * bs + pos % bs) * H + h;
  };
  auto decode_row = [&](const KVCodec& c, const uint8_t* row, float* out) {
    if (!c.plain()) return kv_decode_row(c, row, hd, out);
    for (int64_t i = 0; i < hd; ++i) {
      uint16_t b;
      std::memcpy(&b, row + 2 * i, 2);
      out[i] = bf16_to_f32(b);
    }
  };
  AttentionParams p;
  p.n_heads = c.n_heads, p.n_kv_heads = H, p.head_dim = hd, p.scale = 2.0f / std::sqrt(float(hd)), p.softcap = c.softcap, p.window = c.window;
  const int64_t TQ = query.n_tokens(), G = c.n_heads / H;
  std::vector<float> q = random_bf16(rng, size_t(TQ * q_row), 2.0f), ref(size_t(TQ * q_row));
  std::vector<float> kr(static_cast<size_t>(hd)), vr(static_cast<size_t>(hd));
  for (int64_t t = 0; t < TQ; ++t) {
    const int32_t s = query.seq[size_t(t)], pos = query.pos[size_t(t)];
    const int32_t lo = c.window > 0 ? std::max<int32_t>(0, pos - int32_t(c.window) + 1) : 0;
    for (int64_t hq = 0; hq < c.n_heads; ++hq) {
      const int64_t h = hq / G;
      const float* qv = q.data() + t * q_row + hq * hd;
      std::vector<double> sc, o(size_t(hd), 0.0);
      double mx = -1e300;
      for (int32_t j = lo; j <= pos; ++j) {
        decode_row(cp.k, kp.data() + row_of(s, j, h) * kb, kr.data());
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += double(qv[i]) * kr[size_t(i)];
        d *= p.scale;
        if (c.softcap > 0) d = c.softcap * std::tanh(d / c.softcap);
        sc.push_back(d), mx = std::max(mx, d);
      }
      double sum = 0;
      for (int32_t j = lo; j <= pos; ++j) {
        const double w = std::exp(sc[size_t(j - lo)] - mx);
        sum += w;
        decode_row(cp.v, vp.data() + row_of(s, j, h) * vb, vr.data());
        for (int64_t i = 0; i < hd; ++i) o[size_t(i)] += w * vr[size_t(i)];
      }
      for (int64_t i = 0; i < hd; ++i) ref[size_t(t * q_row + hq * hd + i)] = float(o[size_t(i)] / sum);
    }
  }
  gpu.set_attention_path(path);
  gpu.begin_batch(query);
  Tensor out = gpu.alloc(DType::BF16, {TQ, q_row});
  gpu.attention(0, dev_bf16(gpu, q, {TQ, q_row}), p, out);
  const std::vector<float> got = host_f32(gpu, out);
  // bf16 output (2^-9 relative) of values up to ~1, f32 sums in another order; the prefill path also
  // rounds the dequantized keys and values to bf16.
  const float tol = path == CudaBackend::AttentionPath::Decode ? 1e-2f : 2e-2f;
  EXPECT_LE(max_diff(got, ref), tol) << "max|ref| " << max_abs(ref);
}

// Sets the decode kernel choice for a scope, then hands it back to the environment.
struct KvAttnMode {
  explicit KvAttnMode(int mode) { CudaBackend::set_kv_decode_attention(mode); }
  ~KvAttnMode() { CudaBackend::set_kv_decode_attention(-1); }
};

// The split-K kernels (ARBOR_CUDA_KV_ATTN=v1; the tensor-core kernel, the default for coded rows at head_dim
// 64/128, has its own tests below).
TEST(CudaKVCodec, DecodeAttentionReadsCodes) {
  ARBOR_REQUIRE_GPU();
  KvAttnMode v1(0);
  std::mt19937 rng(11);
  using Path = CudaBackend::AttentionPath;
  for (int64_t hd : {64, 128, 256})
    for (const char* codec : kCodecs) {
      // GQA 1, 4, 8; contexts at block boundaries (1, 16, 17, 32, 33) and over many pages; a window.
      run_attention(codec, {hd, 4, 4, 0, 0.0f, {1, 16, 17, 33}, {1, 1, 1, 1}}, Path::Decode, rng);
      run_attention(codec, {hd, 8, 2, 0, 0.0f, {32, 700, 5}, {1, 1, 1}}, Path::Decode, rng);
      run_attention(codec, {hd, 16, 2, 40, 0.0f, {300, 64}, {1, 1}}, Path::Decode, rng);
      if (hd == 128) {
        run_attention(codec, {hd, 32, 8, 0, 0.0f, {4100}, {1}}, Path::Decode, rng);   // 8B's shape, 257 pages
        run_attention(codec, {hd, 4, 1, 0, 30.0f, {200, 77}, {3, 2}}, Path::Decode, rng);  // softcap, several tokens a sequence
      }
    }
}

TEST(CudaKVCodec, PrefillOverACodedPrefix) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(13);
  using Path = CudaBackend::AttentionPath;
  for (int64_t hd : {64, 128, 256})
    for (const char* codec : {"affine8", "affine4", "k8v4", "k8v3", "k4v2"}) {
      // A fresh prompt, a chunk after a cached prefix (odd lengths), a window; and the generic kernel.
      run_attention(codec, {hd, 4, 4, 0, 0.0f, {40}, {40}}, Path::Prefill, rng);
      run_attention(codec, {hd, 8, 2, 0, 0.0f, {203, 50}, {70, 13}}, Path::Prefill, rng);
      run_attention(codec, {hd, 16, 2, 24, 0.0f, {130}, {61}}, Path::Prefill, rng);
      if (hd == 64) run_attention(codec, {hd, 8, 2, 0, 0.0f, {75, 9}, {20, 9}}, Path::Generic, rng);
    }
}

// A decode step with the q/k prep and the encode of the step's own key and value inside the coded
// decode kernel (prep_attention's fused path) against the same step as qk_prep_kv_write then attention:
// the pools byte-identical, the outputs equal to f32 rounding. Rope on whole lanes, per-head norms,
// GQA 4 and 8, contexts at block boundaries and over many pages.
TEST(CudaKVCodec, DecodeWithThePrepInsideMatchesPrepThenAttention) {
  ARBOR_REQUIRE_GPU();
  KvAttnMode v1(0);  // the split-K kernels' fused prep (DecodeV2WithThePrep... covers the tensor-core one)
  std::mt19937 rng(17);
  for (int64_t hd : {64, 128, 256})
    for (const char* name : {"affine8", "affine4", "k8v4", "k8v3"})
      for (int64_t G : {4, 8}) {
        const std::string what = fmt::format("{} head_dim {} GQA {}", name, hd, G);
        SCOPED_TRACE(what);
        const int64_t H = 2, NQ = H * G, bs = 16;
        const std::vector<int32_t> ctx = {1, 16, 17, 33, 900};
        int64_t n_blocks = 0;
        BatchInfo fill = paged_batch(ctx, ctx, bs, rng, &n_blocks);
        std::mt19937 rng_copy = rng;
        BatchInfo step = paged_batch(ctx, std::vector<int32_t>(ctx.size(), 1), bs, rng_copy, &n_blocks);
        step.block_tables = fill.block_tables;
        KVLayout kv;
        kv.n_layers = 1, kv.n_blocks = n_blocks, kv.block_size = bs, kv.n_kv_heads = H, kv.head_dim = hd;
        kv.codecs = {parse_kv_codec(name)};
        const int64_t TF = fill.n_tokens(), T = step.n_tokens();
        const std::vector<float> kf = random_bf16(rng, size_t(TF * H * hd)), vf = random_bf16(rng, size_t(TF * H * hd));
        const std::vector<float> q = random_bf16(rng, size_t(T * NQ * hd), 2.0f), k = random_bf16(rng, size_t(T * H * hd)),
                                 v = random_bf16(rng, size_t(T * H * hd)), nw = random_bf16(rng, size_t(hd), 0.5f, 1.0f);
        std::vector<float> cs(size_t(1024 * hd / 2)), sn(cs.size());
        for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(0.001f * float(i)), sn[i] = std::sin(0.001f * float(i));
        AttentionParams ap;
        ap.n_heads = NQ, ap.n_kv_heads = H, ap.head_dim = hd, ap.scale = 2.0f / std::sqrt(float(hd));
        std::vector<std::vector<float>> outs;
        std::vector<std::vector<uint8_t>> kpools, vpools;
        for (bool fused : {true, false}) {
          CudaBackend gpu(0);
          gpu.set_fused_prep(fused);
          gpu.alloc_kv(kv);
          gpu.begin_batch(fill);
          gpu.kv_write(0, dev_bf16(gpu, kf, {TF, H * hd}), dev_bf16(gpu, vf, {TF, H * hd}));
          Tensor cos_t = gpu.upload_table(cs, {1024, hd / 2}), sin_t = gpu.upload_table(sn, {1024, hd / 2});
          Tensor qn = gpu.upload_table(nw, {hd}), kn = gpu.upload_table(nw, {hd});
          Backend::QKPrep p;
          p.norm = NormOp::RMS, p.q_norm = &qn, p.k_norm = &kn, p.eps = 1e-5f, p.n_heads = NQ, p.n_kv_heads = H, p.head_dim = hd,
          p.rot_dim = hd, p.cos = &cos_t, p.sin = &sin_t;
          gpu.begin_batch(step);
          Tensor out = gpu.alloc(DType::BF16, {T, NQ * hd});
          gpu.prep_attention(0, dev_bf16(gpu, q, {T, NQ * hd}), dev_bf16(gpu, k, {T, H * hd}), dev_bf16(gpu, v, {T, H * hd}), p, ap, out);
          outs.push_back(host_f32(gpu, out));
          kpools.push_back(host_bytes(gpu, gpu.k_pool(0))), vpools.push_back(host_bytes(gpu, gpu.v_pool(0)));
        }
        EXPECT_TRUE(kpools[0] == kpools[1]) << "K pools differ";
        EXPECT_TRUE(vpools[0] == vpools[1]) << "V pools differ";
        EXPECT_LE(max_diff(outs[0], outs[1]), 8e-3f) << "max|out| " << max_abs(outs[1]);
      }
}

// ---- the tensor-core decode kernel (the default for coded rows, attention_kv.cu's attn_decode_mma_kernel) --


// The fragment layout of kv_mma_layout.h on the CPU (no GPU needed): the logical-to-physical dim maps
// are permutations of a row, and the unpack functions put each code where the map says, against a
// plain model of the mma.sync m16n8k16 operand layout (PTX ISA: B element kk of a lane with q = lane % 4
// is logical k row 2q + (kk & 1) + 8 (kk >> 1)).
template <int KB, int D>
void check_k_dim_permutation() {
  std::vector<int> seen(D, 0);
  for (int q = 0; q < 4; ++q)
    for (int c = 0; c < D / 16; ++c)
      for (int kk = 0; kk < 4; ++kk) {
        const int d = arbor::cuda::kvmma::k_dim<KB, D>(q, c, kk);
        ASSERT_TRUE(d >= q * D / 4 && d < (q + 1) * D / 4) << "KB " << KB << " D " << D << " q " << q << " chunk " << c << " kk " << kk;
        ++seen[size_t(d)];
      }
  for (int d = 0; d < D; ++d) EXPECT_EQ(seen[size_t(d)], 1) << "KB " << KB << " D " << D << " dim " << d;
}

float f16_bits_to_float(uint32_t h) {
  const uint32_t sign = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(m | 1024), int(e) - 25);
  return sign ? -v : v;
}

TEST(CudaKVCodec, MmaFragmentLayoutOnTheCpu) {
  check_k_dim_permutation<4, 64>(), check_k_dim_permutation<4, 128>();
  check_k_dim_permutation<8, 64>(), check_k_dim_permutation<8, 128>();
  check_k_dim_permutation<16, 64>(), check_k_dim_permutation<16, 128>();
  for (int D : {64, 128}) {
    std::vector<int> seen(size_t(D), 0);
    for (int g = 0; g < 8; ++g)
      for (int j = 0; j < D / 8; ++j) ++seen[size_t(D == 64 ? arbor::cuda::kvmma::v_dim<64>(g, j) : arbor::cuda::kvmma::v_dim<128>(g, j))];
    for (int d = 0; d < D; ++d) EXPECT_EQ(seen[size_t(d)], 1) << "v_dim D " << D << " dim " << d;
  }
  std::mt19937 rng(29);
  std::uniform_int_distribution<uint32_t> word;
  for (int it = 0; it < 200; ++it) {
    const uint32_t w = word(rng), w2 = word(rng);
    // 4-bit keys: r[i] halves decode (lo: 1024 + c, hi: 1024 + 16 c) to the nibbles k_dim names, within
    // the word (dims 8u .. 8u + 7 of the lane's run; chunk 2u: b0 = r[0], b1 = r[1]; 2u + 1: r[2], r[3]).
    uint32_t r[8];
    arbor::cuda::kvmma::k_unpack4(w, r);
    for (int ch = 0; ch < 2; ++ch)
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t reg = r[2 * ch + (kk >> 1)], half = (kk & 1) ? reg >> 16 : reg & 0xffff;
        const bool hi = (kk >> 1) == 1;
        const float v = f16_bits_to_float(half);
        const float code = hi ? (v - 1024.0f) / 16.0f : v - 1024.0f;
        const int d = arbor::cuda::kvmma::k_dim<4, 128>(0, ch, kk);  // q 0, word 0: dims 0..7
        EXPECT_EQ(code, float((w >> (4 * d)) & 15)) << "k_unpack4 chunk " << ch << " kk " << kk;
      }
    // 8-bit keys, unsigned and TurboQuant's signed codes.
    for (bool sign8 : {false, true}) {
      arbor::cuda::kvmma::k_unpack8(w, sign8, r);
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t reg = r[kk >> 1], half = (kk & 1) ? reg >> 16 : reg & 0xffff;
        const int d = arbor::cuda::kvmma::k_dim<8, 128>(0, 0, kk);
        const uint32_t byte = (w >> (8 * d)) & 255;
        const float want = sign8 ? float(int8_t(uint8_t(byte))) : float(byte);
        EXPECT_EQ(f16_bits_to_float(half) - (sign8 ? 1152.0f : 1024.0f), want) << "k_unpack8 sign " << sign8 << " kk " << kk;
      }
    }
    // Values: r[i] = (key a's dim i, key b's dim i).
    arbor::cuda::kvmma::v_unpack4(w, w2, r);
    for (int i = 0; i < 8; ++i)
      for (int h = 0; h < 2; ++h) {
        const float v = f16_bits_to_float(h ? r[i] >> 16 : r[i] & 0xffff);
        const float code = i % 2 ? (v - 1024.0f) / 16.0f : v - 1024.0f;
        EXPECT_EQ(code, float(((h ? w2 : w) >> (4 * i)) & 15)) << "v_unpack4 dim " << i << " key " << h;
      }
    arbor::cuda::kvmma::v_unpack8(w, w2, r);
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h)
        EXPECT_EQ(f16_bits_to_float(h ? r[i] >> 16 : r[i] & 0xffff) - 1024.0f, float(((h ? w2 : w) >> (8 * i)) & 255)) << "v_unpack8 dim " << i;
    arbor::cuda::kvmma::v_pair16(w, w2, r);
    EXPECT_EQ(r[0], (w & 0xffffu) | (w2 << 16));
    EXPECT_EQ(r[1], (w >> 16) | (w2 & 0xffff0000u));
    const uint64_t span = uint64_t(w) | uint64_t(w2) << 32;
    for (int e = 0; e < 16; ++e) EXPECT_EQ(arbor::cuda::kvmma::span_code<3>(span, e), uint32_t(span >> (3 * e)) & 7u);
  }
}

// The tensor-core kernel against decode-then-attend: its codecs and bf16 at head_dim 64 and 128 (256
// and the other codecs take the split-K kernels under the switch too), GQA 1 to 16 (8-row and 16-row
// tiles, partial groups of 3, 5, 12), contexts at the 16-key tile and block boundaries, over many pages,
// a window, softcap, several tokens of one sequence.
TEST(CudaKVCodec, DecodeAttentionV2ReadsCodes) {
  ARBOR_REQUIRE_GPU();
  KvAttnMode mode(2);
  std::mt19937 rng(31);
  using Path = CudaBackend::AttentionPath;
  for (int64_t hd : {64, 128, 256})
    for (const char* codec : {"bf16", "affine8", "affine4", "k8v4", "k8v3", "affine3"}) {
      run_attention(codec, {hd, 4, 4, 0, 0.0f, {1, 15, 16, 17, 33, 64, 65}, {1, 1, 1, 1, 1, 1, 1}}, Path::Decode, rng);
      run_attention(codec, {hd, 8, 2, 0, 0.0f, {32, 700, 5}, {1, 1, 1}}, Path::Decode, rng);
      run_attention(codec, {hd, 16, 2, 40, 0.0f, {300, 64}, {1, 1}}, Path::Decode, rng);
      if (hd == 256) continue;
      run_attention(codec, {hd, 6, 2, 0, 0.0f, {129, 3}, {1, 1}}, Path::Decode, rng);     // GQA 3
      run_attention(codec, {hd, 10, 2, 0, 0.0f, {50, 97}, {1, 1}}, Path::Decode, rng);    // GQA 5
      run_attention(codec, {hd, 24, 2, 0, 0.0f, {211, 16}, {1, 1}}, Path::Decode, rng);   // GQA 12: 16-row tiles
      run_attention(codec, {hd, 32, 2, 0, 0.0f, {1000}, {1}}, Path::Decode, rng);         // GQA 16
      run_attention(codec, {hd, 32, 8, 0, 0.0f, {4100}, {1}}, Path::Decode, rng);         // 8B's shape, 257 pages
      run_attention(codec, {hd, 4, 1, 0, 30.0f, {200, 77}, {3, 2}}, Path::Decode, rng);   // softcap, several tokens a sequence
      run_attention(codec, {hd, 8, 8, 0, 0.0f, {17, 4096, 2000, 1}, {1, 1, 1, 1}}, Path::Decode, rng);  // a batch of mixed lengths
    }
}

// The tensor-core kernel with the q/k prep (prep_attention: the prep kernel, then the attention) against
// the split-K kernels as qk_prep_kv_write then attention: the pools byte-identical, the outputs within
// the kernels' rounding difference (f16 keys and values in the new kernel).
TEST(CudaKVCodec, DecodeV2WithThePrepMatchesTheSplitKKernels) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(37);
  for (int64_t hd : {64, 128})
    for (const char* name : {"bf16", "affine8", "affine4", "k8v4", "k8v3"})
      for (int64_t G : {1, 4, 8, 16}) {
        const std::string what = fmt::format("{} head_dim {} GQA {}", name, hd, G);
        SCOPED_TRACE(what);
        const int64_t H = 2, NQ = H * G, bs = 16;
        const std::vector<int32_t> ctx = {1, 16, 17, 33, 900};
        int64_t n_blocks = 0;
        BatchInfo fill = paged_batch(ctx, ctx, bs, rng, &n_blocks);
        std::mt19937 rng_copy = rng;
        BatchInfo step = paged_batch(ctx, std::vector<int32_t>(ctx.size(), 1), bs, rng_copy, &n_blocks);
        step.block_tables = fill.block_tables;
        KVLayout kv;
        kv.n_layers = 1, kv.n_blocks = n_blocks, kv.block_size = bs, kv.n_kv_heads = H, kv.head_dim = hd;
        kv.codecs = {parse_kv_codec(name)};
        const int64_t TF = fill.n_tokens(), T = step.n_tokens();
        const std::vector<float> kf = random_bf16(rng, size_t(TF * H * hd)), vf = random_bf16(rng, size_t(TF * H * hd));
        const std::vector<float> q = random_bf16(rng, size_t(T * NQ * hd), 2.0f), k = random_bf16(rng, size_t(T * H * hd)),
                                 v = random_bf16(rng, size_t(T * H * hd)), nw = random_bf16(rng, size_t(hd), 0.5f, 1.0f);
        std::vector<float> cs(size_t(1024 * hd / 2)), sn(cs.size());
        for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(0.001f * float(i)), sn[i] = std::sin(0.001f * float(i));
        AttentionParams ap;
        ap.n_heads = NQ, ap.n_kv_heads = H, ap.head_dim = hd, ap.scale = 2.0f / std::sqrt(float(hd));
        std::vector<std::vector<float>> outs;
        std::vector<std::vector<uint8_t>> kpools, vpools;
        for (int mode : {2, 0}) {
          KvAttnMode m(mode);
          CudaBackend gpu(0);
          gpu.set_fused_prep(mode == 2);
          gpu.alloc_kv(kv);
          gpu.begin_batch(fill);
          gpu.kv_write(0, dev_bf16(gpu, kf, {TF, H * hd}), dev_bf16(gpu, vf, {TF, H * hd}));
          Tensor cos_t = gpu.upload_table(cs, {1024, hd / 2}), sin_t = gpu.upload_table(sn, {1024, hd / 2});
          Tensor qn = gpu.upload_table(nw, {hd}), kn = gpu.upload_table(nw, {hd});
          Backend::QKPrep p;
          p.norm = NormOp::RMS, p.q_norm = &qn, p.k_norm = &kn, p.eps = 1e-5f, p.n_heads = NQ, p.n_kv_heads = H, p.head_dim = hd,
          p.rot_dim = hd, p.cos = &cos_t, p.sin = &sin_t;
          gpu.begin_batch(step);
          Tensor out = gpu.alloc(DType::BF16, {T, NQ * hd});
          gpu.prep_attention(0, dev_bf16(gpu, q, {T, NQ * hd}), dev_bf16(gpu, k, {T, H * hd}), dev_bf16(gpu, v, {T, H * hd}), p, ap, out);
          outs.push_back(host_f32(gpu, out));
          kpools.push_back(host_bytes(gpu, gpu.k_pool(0))), vpools.push_back(host_bytes(gpu, gpu.v_pool(0)));
        }
        EXPECT_TRUE(kpools[0] == kpools[1]) << "K pools differ";
        EXPECT_TRUE(vpools[0] == vpools[1]) << "V pools differ";
        EXPECT_LE(max_diff(outs[0], outs[1]), 1e-2f) << "max|out| " << max_abs(outs[1]);
      }
}

TEST(CudaKVCodec, RefusesWhatTheKernelsCannotTake) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  KVLayout kv;
  kv.n_layers = 2, kv.n_blocks = 4, kv.block_size = 16, kv.n_kv_heads = 2, kv.head_dim = 192;  // affine takes 192 on the CPU
  kv.codecs = {KVCodecPair{}, parse_kv_codec("affine8")};
  try {
    gpu.alloc_kv(kv);
    ADD_FAILURE() << "head_dim 192 with affine8 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("affine8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("192"), std::string::npos) << e.what();
  }
}

// ---- model level ----------------------------------------------------------------------------------

json config(const char* type, const char* arch) {
  return json{{"model_type", type}, {"architectures", {arch}}, {"vocab_size", 300}, {"hidden_size", 256}, {"intermediate_size", 512},
              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
              {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 512}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0}};
}

// Teacher-forced logits: prefill in chunks of `chunk` (the later chunks over the coded prefix), then one
// token per step.
std::vector<float> model_logits(Model& m, Backend& be, const std::vector<int32_t>& tokens, int64_t prefill, int64_t chunk) {
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  SequenceKV seq;
  EXPECT_TRUE(seq.reserve(pool, int64_t(tokens.size())));
  const int64_t V = m.config().vocab_size;
  std::vector<float> out(tokens.size() * size_t(V));
  for (int64_t p0 = 0; p0 < int64_t(tokens.size());) {
    const int64_t n = p0 < prefill ? std::min(chunk, prefill - p0) : 1;
    std::vector<int32_t> part(tokens.begin() + p0, tokens.begin() + p0 + n);
    BatchInfo b = make_batch({part}, {p0}, {&seq}, true);
    m.forward(b, out.data() + p0 * V);
    seq.length = p0 + n;
    p0 += n;
  }
  seq.release(pool);
  return out;
}

// CUDA with each codec against the CPU with the same codec. The CPU runs f32 activations and encodes
// f32 keys and values, the GPU bf16, so a code may land one step apart (an affine4 step is 1/15 of its
// group's range): the bounds are above the bf16 cache's 2e-2, by codec, about 1.5x the largest
// measured on the H200 (round 1: affine8 1.5%, k8v4 4.2%, k8v3 6.3%, affine4 6.8%, k8v3,0:bf16 4.9% of
// max|logit|, all on these three models).
TEST(CudaKVCodec, ModelLogitsMatchTheCpuWithTheSameCodec) {
  ARBOR_REQUIRE_GPU();
  json qwen3 = config("qwen3", "Qwen3ForCausalLM");
  qwen3["num_attention_heads"] = 8, qwen3["num_key_value_heads"] = 1, qwen3["head_dim"] = 128;
  json gemma2 = config("gemma2", "Gemma2ForCausalLM");
  gemma2["sliding_window"] = 8, gemma2["attn_logit_softcapping"] = 50.0, gemma2["final_logit_softcapping"] = 30.0;
  gemma2["query_pre_attn_scalar"] = 64, gemma2["hidden_activation"] = "gelu_pytorch_tanh", gemma2["tie_word_embeddings"] = true;
  const std::vector<std::pair<std::string, json>> models = {{"llama", config("llama", "LlamaForCausalLM")}, {"qwen3_hd128", qwen3},
                                                            {"gemma2", gemma2}};
  struct Bound {
    const char* codec;
    float rel;
  };
  const Bound bounds[] = {{"affine8", 3e-2f}, {"k8v4", 6e-2f}, {"k8v3", 9e-2f}, {"affine4", 1e-1f}, {"k8v3,0:bf16", 8e-2f}};
  for (const auto& [name, cfg] : models) {
    LoadOptions opt;
    fs::path dir = fs::path(testing::TempDir()) / ("arbor_cuda_kvcodec_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    opt.model_dir = dir.string();
    write_synthetic_checkpoint(cfg, opt.model_dir, DType::BF16);
    opt.ctx_size = 256, opt.max_step_tokens = 64, opt.show_progress = false;
    std::mt19937 rng(7);
    std::vector<int32_t> tokens(140);
    for (auto& t : tokens) t = int32_t(rng() % 300u);
    for (const Bound& bd : bounds) {
      SCOPED_TRACE(name + " " + bd.codec);
      opt.kv_cache = bd.codec;
      CpuBackend cpu(2, WeightPlacement::Mapped);
      CudaBackend gpu(0);
      Model mc(opt, cpu), mg(opt, gpu);
      const std::vector<float> lc = model_logits(mc, cpu, tokens, 100, 40), lg = model_logits(mg, gpu, tokens, 100, 40);
      const float ref = max_abs(lc), diff = max_diff(lg, lc);
      EXPECT_LE(diff, bd.rel * ref) << "max|ref| " << ref;
      std::printf("[ %s %s ] CUDA vs CPU, same codec: max|Δlogit| %.3g of max|ref| %.3g (%.2f%%)\n", name.c_str(), bd.codec, double(diff),
                  double(ref), 100.0 * double(diff) / double(ref));
    }
  }
}

}  // namespace
