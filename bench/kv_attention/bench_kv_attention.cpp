// CPU attention over the KV cache per codec (--kv-cache): one layer's decode attention (batch B, one
// token each, context C) and the time to write (encode) the rows, for every codec against the plain f32
// cache. Prints ms per step, the KV bytes the step reads and the read rate, and the speed against plain.
// Usage: bench_kv_attention [--ctx 4096] [--batch 1] [--heads 32] [--kv-heads 8] [--head-dim 64]
//                           [--threads 0] [--reps 20] [--codecs bf16,affine8,affine4,k8v4,k8v3] [--cold-mb 96]
// (defaults: one layer of the Llama-3.2-1B shape at context 4096). CPU: copies of the layer are called
// in turn, enough that their KV totals --cold-mb (default 96, past this machine's 32 MB L3; 0: one layer,
// its KV hot in cache), as a model's decode step finds it; the read bandwidth is measured in the same run.
// --device cuda (builds with CUDA): the CUDA backend's decode attention per codec and decode kernel
// (--kernels v1,v2: the split-K kernels, the tensor-core kernel of ARBOR_CUDA_KV_ATTN=v2; bf16 under
// v2 is v2all), over --layers copies of the layer (default 8, called in turn, so the KV of a call is not
// in L2 from the previous one); prints us per layer call (mean of --reps calls, launches queued back to
// back), the KV bytes a call reads and the rate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <ctime>
#include <vector>

#include "backend/cpu/bandwidth.h"
#include "backend/cpu/cpu_backend.h"
#if defined(ARBOR_HAS_CUDA)
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#endif

using namespace arbor;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

#if defined(ARBOR_HAS_CUDA)
int bench_cuda(int64_t ctx, int64_t batch, int64_t heads, int64_t kv_heads, int64_t hd, int reps, int64_t layers, const std::string& codecs,
               const std::string& kernels) {
  const int64_t bs = 16, blocks_per_seq = (ctx + bs - 1) / bs, row = kv_heads * hd, chunk = std::min<int64_t>(ctx, 4096);
  std::mt19937 rng(1);
  std::normal_distribution<float> N;
  auto bf16s = [&](size_t n) {
    std::vector<uint16_t> h(n);
    for (auto& x : h) x = f32_to_bf16(N(rng));
    return h;
  };
  const std::vector<uint16_t> k = bf16s(size_t(chunk * row)), v = bf16s(size_t(chunk * row)), q = bf16s(size_t(batch * heads * hd));
  std::printf("CUDA decode attention, one layer call: batch %lld, context %lld, %lld heads / %lld KV heads, head_dim %lld, %lld layers in turn\n",
              (long long)batch, (long long)ctx, (long long)heads, (long long)kv_heads, (long long)hd, (long long)layers);
  std::printf("%-10s %-7s %10s %12s %10s %9s\n", "codec", "kernel", "us/call", "KV MB/call", "GB/s", "vs bf16");
  double plain_us = 0;
  for (const std::string& name : split(codecs))
    for (const std::string& kern : split(kernels)) {
      const KVCodecPair cp = parse_kv_codec(name);
      const int mode = kern == "v1" ? 0 : kern == "v2" ? (cp.plain() ? 2 : 1) : -2;
      if (mode == -2) {
        std::fprintf(stderr, "bench_kv_attention: --kernels takes v1, v2 (got %s)\n", kern.c_str());
        return 2;
      }
      CudaBackend::set_kv_decode_attention(mode);
      CudaBackend gpu(0);
      KVLayout L;
      L.n_layers = layers, L.block_size = bs, L.n_kv_heads = kv_heads, L.head_dim = hd, L.n_blocks = batch * blocks_per_seq;
      L.codecs.assign(size_t(layers), cp);
      gpu.alloc_kv(L);
      Tensor kt = gpu.alloc(DType::BF16, {chunk, row}), vt = gpu.alloc(DType::BF16, {chunk, row});
      gpu.upload(k.data(), kt), gpu.upload(v.data(), vt);
      for (int64_t s = 0; s < batch; ++s)
        for (int64_t p0 = 0; p0 < ctx; p0 += chunk) {
          BatchInfo b;
          b.max_blocks = int32_t(blocks_per_seq);
          for (int64_t j = 0; j < blocks_per_seq; ++j) b.block_tables.push_back(int32_t(s * blocks_per_seq + j));
          const int64_t n = std::min<int64_t>(chunk, ctx - p0);
          for (int64_t p = p0; p < p0 + n; ++p) b.tokens.push_back(0), b.pos.push_back(int32_t(p)), b.seq.push_back(0);
          b.ctx_len.push_back(int32_t(p0 + n));
          gpu.begin_batch(b);
          for (int64_t l = 0; l < layers; ++l) gpu.kv_write(l, kt.row_slice(0, n), vt.row_slice(0, n));
        }
      BatchInfo b;
      b.max_blocks = int32_t(blocks_per_seq);
      for (int64_t s = 0; s < batch; ++s) {
        for (int64_t j = 0; j < blocks_per_seq; ++j) b.block_tables.push_back(int32_t(s * blocks_per_seq + j));
        b.tokens.push_back(0), b.pos.push_back(int32_t(ctx - 1)), b.seq.push_back(int32_t(s)), b.ctx_len.push_back(int32_t(ctx));
      }
      gpu.begin_batch(b);
      AttentionParams ap;
      ap.n_heads = heads, ap.n_kv_heads = kv_heads, ap.head_dim = hd, ap.scale = 1.0f / std::sqrt(float(hd));
      Tensor qt = gpu.alloc(DType::BF16, {batch, heads * hd}), ot = gpu.alloc(DType::BF16, {batch, heads * hd});
      gpu.upload(q.data(), qt);
      for (int64_t l = 0; l < layers; ++l) gpu.attention(l, qt, ap, ot);  // warm-up
      gpu.synchronize();
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) gpu.attention(r % layers, qt, ap, ot);
      gpu.synchronize();
      const double us = seconds_since(t0) / reps * 1e6;
      const double bytes = double(batch * ctx) * double(L.layer_token_bytes(0, DType::BF16));
      if (cp.plain() && kern == "v1") plain_us = us;
      std::printf("%-10s %-7s %10.2f %12.2f %10.1f %8.2fx\n", name.c_str(), kern.c_str(), us, bytes * 1e-6, bytes / us * 1e-3,
                  plain_us > 0 ? plain_us / us : 0.0);
      std::fflush(stdout);
    }
  CudaBackend::set_kv_decode_attention(-1);
  std::printf("(vs bf16: against the bf16 cache with v1; us/call is the mean of %d calls)\n", reps);
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int64_t ctx = 4096, batch = 1, heads = 32, kv_heads = 8, hd = 64;
  int threads = 0, reps = 20;
  std::string codecs = "bf16,affine8,affine4,k8v4,k8v3", device = "cpu", kernels = "v1,v2";
  int64_t layers = 8;
  double cold_mb = 96;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--ctx") ctx = std::atoll(v);
    else if (k == "--batch") batch = std::atoll(v);
    else if (k == "--heads") heads = std::atoll(v);
    else if (k == "--kv-heads") kv_heads = std::atoll(v);
    else if (k == "--head-dim") hd = std::atoll(v);
    else if (k == "--threads") threads = std::atoi(v);
    else if (k == "--reps") reps = std::atoi(v);
    else if (k == "--codecs") codecs = v;
    else if (k == "--device") device = v;
    else if (k == "--kernels") kernels = v;
    else if (k == "--layers") layers = std::atoll(v);
    else if (k == "--cold-mb") cold_mb = std::atof(v);
    else {
      std::fprintf(stderr, "bench_kv_attention: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (device == "cuda") {
#if defined(ARBOR_HAS_CUDA)
    return bench_cuda(ctx, batch, heads, kv_heads, hd, reps, layers, codecs, kernels);
#else
    (void)layers;
    std::fprintf(stderr, "bench_kv_attention: --device cuda needs a build with CUDA\n");
    return 2;
#endif
  }
  if (device != "cpu") {
    std::fprintf(stderr, "bench_kv_attention: --device %s (cpu or cuda)\n", device.c_str());
    return 2;
  }
  const int64_t bs = 16, blocks_per_seq = (ctx + bs - 1) / bs, row = kv_heads * hd;
  std::mt19937 rng(1);
  std::normal_distribution<float> N;
  std::vector<float> k(size_t(ctx * row)), v(k.size()), q(size_t(batch * heads * hd)), out(q.size());
  for (auto& x : k) x = N(rng);
  for (auto& x : v) x = N(rng);
  for (auto& x : q) x = N(rng);
  std::printf("decode attention, one layer: batch %lld, context %lld, %lld heads / %lld KV heads, head_dim %lld\n", (long long)batch,
              (long long)ctx, (long long)heads, (long long)kv_heads, (long long)hd);
  std::printf("%-10s %10s %10s %12s %10s %8s %9s %8s %14s\n", "codec", "ms/step", "cpu ms", "KV MB/step", "GB/s", "of bw", "vs plain", "layers",
              "encode us/tok");
  double plain_ms = 0, bw = 0;
  for (const std::string& name : split(codecs)) {
    CpuBackend be(threads, WeightPlacement::Copy);
    if (bw == 0) {  // the read bandwidth on the same threads, measured now (best of 3 passes over 1 GiB)
      cpu::ReadBandwidthProbe probe(be.pool());
      for (int i = 0; i < 4; ++i) probe.pass();
      bw = probe.best();
      std::printf("(read bandwidth %.2f GB/s, %d threads, measured now)\n", bw * 1e-9, be.pool().size());
    }
    const KVCodecPair cp = parse_kv_codec(name);
    // Copies of the layer, called in turn, so that their KV together is at least --cold-mb and a call
    // does not find its KV in L3 from the previous one (a model's decode step streams every layer's).
    const double layer_bytes = double(batch * ctx) * double(cp.token_bytes(kv_heads, hd, sizeof(float)));
    const int64_t n_layers = cold_mb <= 0 ? 1 : std::clamp<int64_t>(int64_t(std::ceil(cold_mb * 1e6 / layer_bytes)), 1, 256);
    KVLayout L;
    L.n_layers = n_layers, L.block_size = bs, L.n_kv_heads = kv_heads, L.head_dim = hd, L.n_blocks = batch * blocks_per_seq;
    L.codecs.assign(size_t(n_layers), cp);
    be.alloc_kv(L);
    // Fill every sequence's cache (prefill-style writes, 256 tokens per call), timing the writes.
    double write_s = 0;
    for (int64_t s = 0; s < batch; ++s)
      for (int64_t p0 = 0; p0 < ctx; p0 += 256) {
        BatchInfo b;
        b.max_blocks = int32_t(blocks_per_seq);
        b.block_tables.assign(size_t(blocks_per_seq), 0);
        for (int64_t j = 0; j < blocks_per_seq; ++j) b.block_tables[size_t(j)] = int32_t(s * blocks_per_seq + j);
        const int64_t n = std::min<int64_t>(256, ctx - p0);
        for (int64_t p = p0; p < p0 + n; ++p) b.tokens.push_back(0), b.pos.push_back(int32_t(p)), b.seq.push_back(0);
        b.ctx_len.push_back(int32_t(p0 + n));
        be.begin_batch(b);
        for (int64_t l = 0; l < n_layers; ++l) {
          auto t0 = std::chrono::steady_clock::now();
          be.kv_write(l, Tensor(k.data() + p0 * row, DType::F32, {n, row}), Tensor(v.data() + p0 * row, DType::F32, {n, row}));
          if (l == 0) write_s += seconds_since(t0);
        }
      }
    // The decode step: token at position ctx - 1 of each sequence.
    BatchInfo b;
    b.max_blocks = int32_t(blocks_per_seq);
    for (int64_t s = 0; s < batch; ++s) {
      for (int64_t j = 0; j < blocks_per_seq; ++j) b.block_tables.push_back(int32_t(s * blocks_per_seq + j));
      b.tokens.push_back(0), b.pos.push_back(int32_t(ctx - 1)), b.seq.push_back(int32_t(s)), b.ctx_len.push_back(int32_t(ctx));
    }
    be.begin_batch(b);
    AttentionParams ap;
    ap.n_heads = heads, ap.n_kv_heads = kv_heads, ap.head_dim = hd, ap.scale = 1.0f / std::sqrt(float(hd));
    const Tensor qt(q.data(), DType::F32, {batch, heads * hd}), ot(out.data(), DType::F32, {batch, heads * hd});
    for (int64_t l = 0; l < n_layers; ++l) be.attention(l, qt, ap, ot);  // warm-up
    // Each rep calls every layer in turn; the figure is the best rep's mean per call.
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      const double c0 = process_cpu_seconds();
      for (int64_t l = 0; l < n_layers; ++l) be.attention(l, qt, ap, ot);
      best = std::min(best, seconds_since(t0) / double(n_layers));
      best_cpu = std::min(best_cpu, (process_cpu_seconds() - c0) / double(n_layers));
    }
    const double bytes = layer_bytes;
    if (name == "bf16") plain_ms = best * 1e3;
    std::printf("%-10s %10.3f %10.3f %12.2f %10.2f %7.1f%% %8.2fx %8lld %14.2f\n", name.c_str(), best * 1e3, best_cpu * 1e3, bytes * 1e-6,
                bytes / best * 1e-9, 100.0 * bytes / best / bw, plain_ms > 0 ? plain_ms / (best * 1e3) : 0.0, (long long)n_layers,
                write_s / double(batch * ctx) * 1e6);
    std::fflush(stdout);
  }
  std::printf("(bf16 = the CPU's plain cache, f32; ms/step: per layer call, the best of %d rounds over the layers; cpu ms: the\n"
              " process's CPU time per call, all threads, best round (on a shared machine, what the call cost when it ran);\n"
              " of bw: the KV bytes a call reads per second against the read bandwidth)\n",
              reps);
  return 0;
}
