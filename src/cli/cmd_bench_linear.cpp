// `arbor bench-linear`: the CPU linear kernels at real model shapes. Decode (T=1) is quoted as GB/s of
// weights streamed and as a fraction of the read bandwidth measured in the same run; prefill as GFLOP/s.
// With --bits the weights are MLX affine (codes + scales + biases, all counted as bytes read) and the
// prefill table also shows the dense GEMM on the same shape for comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/bandwidth.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/linear_affine.h"
#include "backend/cpu/linear_trellis.h"
#include "cli/args.h"
#include "cli/verb.h"
#include "core/error.h"
#ifdef ARBOR_HAS_CUDA
#include "backend/cuda/affine.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/trellis.h"
#endif

namespace {

using arbor::DType;
using arbor::ThreadPool;
namespace cpu = arbor::cpu;

struct LinearShape {
  const char* model;
  const char* name;
  int64_t N, K;  // W [N, K]
  int per_layer;  // how many times one decoder layer runs this shape (k and v, gate and up: 2)
};

// Qwen3-0.6B: hidden 1024, 16 q heads / 8 kv heads of 128, intermediate 3072, vocab 151936.
// Llama-3.2-1B: hidden 2048, 32 q heads / 8 kv heads of 64, intermediate 8192, vocab 128256.
const std::vector<LinearShape> kShapes = {
    {"qwen3-0.6b", "q_proj", 2048, 1024, 1},    {"qwen3-0.6b", "k/v_proj", 1024, 1024, 2},
    {"qwen3-0.6b", "o_proj", 1024, 2048, 1},    {"qwen3-0.6b", "gate/up", 3072, 1024, 2},
    {"qwen3-0.6b", "down", 1024, 3072, 1},      {"qwen3-0.6b", "lm_head", 151936, 1024, 0},
    {"llama-3.2-1b", "q_proj", 2048, 2048, 1},  {"llama-3.2-1b", "k/v_proj", 512, 2048, 2},
    {"llama-3.2-1b", "o_proj", 2048, 2048, 1},  {"llama-3.2-1b", "gate/up", 8192, 2048, 2},
    {"llama-3.2-1b", "down", 2048, 8192, 1},    {"llama-3.2-1b", "lm_head", 128256, 2048, 0},
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Deterministic, non-zero weights in a trained layer's range (no denormals, no NaN).
void fill_weights(ThreadPool& pool, void* w, DType type, int64_t n, uint32_t seed) {
  pool.parallel_for(n, 1 << 16, [&](int, int64_t b, int64_t e) {
    uint32_t s = seed * 2654435761u + uint32_t(b);
    for (int64_t i = b; i < e; ++i) {
      s = s * 1664525u + 1013904223u;
      const float v = (float(s >> 8) / float(1 << 24) - 0.5f) * 0.08f + 1e-3f;
      if (type == DType::F32) static_cast<float*>(w)[i] = v;
      else if (type == DType::F16) static_cast<uint16_t*>(w)[i] = arbor::f32_to_f16(v);
      else static_cast<uint16_t*>(w)[i] = arbor::f32_to_bf16(v);
    }
  });
}

// A weight matrix in several copies whose total exceeds the caches, used round-robin so every decode
// call reads its weights from DRAM, as in a real decode step.
struct WeightCopies {
  std::vector<cpu::HugePageBuffer> bufs;
  WeightCopies(ThreadPool& pool, int64_t N, int64_t K, DType type, size_t min_total, size_t min_copies = 2) {
    const size_t bytes = size_t(N * K) * arbor::dtype_size(type);
    const size_t copies = std::max<size_t>(min_copies, (min_total + bytes - 1) / bytes);
    for (size_t c = 0; c < copies; ++c) {
      bufs.emplace_back(bytes);
      fill_weights(pool, bufs.back().data(), type, N * K, uint32_t(c + 1));
    }
  }
};

// Affine weights in several copies (as WeightCopies): random codes, scales and biases in `sdtype` around a
// trained layer's range.
struct AffineCopies {
  std::vector<cpu::HugePageBuffer> codes, params;  // params: scales then biases, [N, K/G] each
  int64_t N, K;
  int bits, G;
  DType sdtype;
  size_t bytes() const { return size_t(N * K * bits / 8) + 2 * size_t(N * (K / G)) * arbor::dtype_size(sdtype); }
  AffineCopies(ThreadPool& pool, int64_t N_, int64_t K_, int bits_, int G_, DType sdtype_, size_t min_total)
      : N(N_), K(K_), bits(bits_), G(G_), sdtype(sdtype_) {
    const size_t copies = std::max<size_t>(2, (min_total + bytes() - 1) / bytes());
    const int64_t words = N * K * bits / 32, groups = N * (K / G);
    for (size_t c = 0; c < copies; ++c) {
      codes.emplace_back(size_t(words) * 4);
      uint32_t* w = codes.back().as<uint32_t>();
      pool.parallel_for(words, 1 << 16, [&](int, int64_t b, int64_t e) {
        uint32_t s = uint32_t(c + 1) * 2654435761u + uint32_t(b);
        for (int64_t i = b; i < e; ++i) s = s * 1664525u + 1013904223u, w[i] = s ^ (s >> 15);
      });
      params.emplace_back(2 * size_t(groups) * arbor::dtype_size(sdtype));
      const float scale = 0.08f / float((1 << bits) - 1);
      for (int64_t i = 0; i < 2 * groups; ++i) {
        const float v = i < groups ? scale * (1.0f + 0.001f * float(i % 7)) : -0.04f;
        if (sdtype == DType::F32) params.back().as<float>()[i] = v;
        else if (sdtype == DType::F16) params.back().as<uint16_t>()[i] = arbor::f32_to_f16(v);
        else params.back().as<uint16_t>()[i] = arbor::f32_to_bf16(v);
      }
    }
  }
  cpu::AffineMatrix matrix(size_t c) const {
    const auto* p = static_cast<const uint8_t*>(params[c].data());
    return {codes[c].as<uint32_t>(), p, p + size_t(N * (K / G)) * arbor::dtype_size(sdtype), sdtype, bits, G, N, K};
  }
};

// --device cuda: the affine decode GEMV (affine_gemv.cu) at Llama-3.1-8B's shapes, in GB/s of weights (codes
// plus scale/bias words) and as a fraction of the device-to-device copy bandwidth measured in the same run.
int bench_linear_cuda(const arbor::cli::Args& args) {
#ifdef ARBOR_HAS_CUDA
  const bool trellis = args.get_or("format", "dense") == "trellis";
  const int bits = int(args.get_int("bits", trellis ? 2 : 4)), gs = int(args.get_int("group-size", 64)), reps = int(args.get_int("reps", 20));
  ARBOR_CHECK(!trellis || bits == 2 || bits == 3 || bits == 4, "bench-linear: --format trellis: --bits {} (2, 3, 4)", bits);
  ARBOR_CHECK(trellis || ((bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8) && (gs == 32 || gs == 64 || gs == 128)),
              "bench-linear: --bits must be 2/3/4/5/6/8 and --group-size 32/64/128 (got {} and {})", bits, gs);
  const int64_t max_T = trellis ? arbor::cuda::kTrellisGemvMaxRows : arbor::cuda::kAffineGemvMaxRows;
  std::vector<int64_t> Ts;
  const std::string tlist = args.get_or("decode-tokens", "1");
  for (size_t b = 0; b <= tlist.size();) {
    const size_t e = std::min(tlist.find(',', b), tlist.size());
    const std::string t = tlist.substr(b, e - b);
    ARBOR_CHECK(!t.empty() && t.find_first_not_of("0123456789") == std::string::npos, "bench-linear: --decode-tokens '{}': rows, or a list (1,8)",
                tlist);
    Ts.push_back(std::stoll(t));
    b = e + 1;
  }
  for (int64_t T : Ts)
    ARBOR_CHECK(T >= 1 && T <= max_T, "bench-linear: --decode-tokens {} (1..{} on cuda)", T, max_T);
  std::string why;
  ARBOR_CHECK(arbor::cuda_device_available(&why), "bench-linear: --device cuda: {}", why);
  const double bw = arbor::cuda_measure_copy_bandwidth();
  if (trellis)  // the down projection on axis 0 (stored transposed), the rest on axis 1, as arbor synth --format trellis
    std::printf("bench-linear: cuda, trellis k=%d weights (1MAD, f32 row scales), copy bandwidth %.1f GB/s (read + written, median of 10)\n\n",
                bits, bw / 1e9);
  else
    std::printf("bench-linear: cuda, affine %d-bit g%d weights (bf16 scale/bias), copy bandwidth %.1f GB/s (read + written, median of 10)\n\n",
                bits, gs, bw / 1e9);
  std::printf("%-13s %-9s %-14s %3s %10s %9s %8s %7s\n", "model", "linear", "N x K", "T", "MB", "us", "GB/s", "of copy");
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  for (const Shape& s : {Shape{"q/o_proj", 4096, 4096}, Shape{"k/v_proj", 1024, 4096}, Shape{"gate/up", 14336, 4096},
                         Shape{"down", 4096, 14336}, Shape{"lm_head", 128256, 4096}})
    for (int64_t T : Ts) {
      const int axis = std::string(s.name) == "down" ? 0 : 1;
      const double bytes = trellis ? arbor::cuda::trellis_weight_bytes(s.N, s.K, bits, axis) : arbor::cuda::affine_weight_bytes(s.N, s.K, bits, gs);
      const double sec = trellis ? arbor::cuda::time_trellis_gemv(s.N, s.K, T, bits, axis, reps)
                                 : arbor::cuda::time_affine_gemv(s.N, s.K, T, bits, gs, reps);
      std::printf("%-13s %-9s %6lld x %-5lld %3lld %10.2f %9.2f %8.1f %6.1f%%\n", "llama-3.1-8b", s.name, (long long)s.N, (long long)s.K,
                  (long long)T, bytes / 1e6, sec * 1e6, bytes / sec / 1e9, 100.0 * bytes / sec / bw);
      std::fflush(stdout);
    }
  return 0;
#else
  (void)args;
  arbor::fail("bench-linear: --device cuda: this build has no CUDA");
#endif
}

// --format trellis: the trellis kernels (cpu/linear_trellis) on random code words (all valid codes) at the same
// shapes, k bits, the down projection on axis 0 (as arbor quantize writes it) and the rest on axis 1 (--axis). Decode as
// weights per second and GB/s of words streamed (the weights are 8x-4x smaller than bf16: the decode
// arithmetic, not the bandwidth, is the limit on most CPUs); prefill as GFLOP/s of the equivalent dense product.
int bench_trellis(const std::vector<LinearShape>& shapes, int threads, int reps, int64_t decode_T, int64_t gemm_T, int k,
                  const std::string& kernel_name, int other_axis) {
  cpu::TrellisKernel kernel = cpu::trellis_best_kernel();
  if (!kernel_name.empty()) {
    bool found = false;
    for (auto kk : {cpu::TrellisKernel::Reference, cpu::TrellisKernel::Avx2, cpu::TrellisKernel::Avx512, cpu::TrellisKernel::Avx512Vbmi})
      if (kernel_name == cpu::trellis_kernel_name(kk)) kernel = kk, found = true;
    ARBOR_CHECK(found && cpu::trellis_kernel_supported(kernel), "bench-linear: --isa '{}': trellis kernels are reference, avx2, avx512, avx512vbmi "
                "(this CPU: {})", kernel_name, cpu::cpu_features().summary());
  }
  ThreadPool pool(threads);
  const auto& f = cpu::cpu_features();
  std::printf("bench-linear: %s [%s], %d thread(s), trellis k=%d (1MAD, L 12), %s kernels\n\n", f.brand.c_str(), f.summary().c_str(), threads,
              k, cpu::trellis_kernel_name(kernel));
  std::printf("%-13s %-9s %-14s %-4s | T=%-2lld %-14s %9s %7s | T=%-4lld %-14s %8s\n", "model", "linear", "N x K", "axis", (long long)decode_T,
              "kernel", "Gw/s", "GB/s", (long long)gemm_T, "kernel", "GFLOP/s");
  for (const auto& s : shapes) {
    const int axis = std::string(s.name) == "down" ? 0 : other_axis;
    const int64_t rows = axis == 1 ? s.N : s.K, cols = axis == 1 ? s.K : s.N;
    const size_t words = size_t(rows * cols * k / 32);
    // Copies totalling >= 256 MiB, used round-robin, so decode reads its words from DRAM.
    const size_t copies = std::max<size_t>(2, (size_t(256) << 20) / (words * 4) + 1);
    std::vector<std::vector<uint32_t>> w(copies, std::vector<uint32_t>(words));
    uint32_t st = 12345;
    for (auto& c : w)
      for (auto& x : c) st = st * 1664525u + 1013904223u, x = st ^ (st >> 15);
    std::vector<float> scales(size_t(rows), 0.01f);
    std::vector<float> x(size_t(std::max(gemm_T, decode_T) * s.K));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7919 % 2001) - 1000) * 1e-3f + 1e-4f;
    std::vector<float> y(size_t(std::max(gemm_T, decode_T) * s.N));
    const int64_t calls = std::max<int64_t>(int64_t(copies), int64_t(4e8 / double(s.N * s.K)) + 1);
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const double t0 = now_s();
      for (int64_t c = 0; c < calls; ++c) {
        const cpu::TrellisWeights tw{w[size_t(c) % copies].data(), scales.data(), k, axis, s.N, s.K};
        cpu::linear_trellis(pool, x.data(), decode_T, tw, nullptr, y.data(), kernel);
      }
      best = std::min(best, (now_s() - t0) / double(calls));
    }
    double gflops = 0;
    if (gemm_T > 0 && s.per_layer > 0) {
      double gbest = 1e30;
      const cpu::TrellisWeights tw{w[0].data(), scales.data(), k, axis, s.N, s.K};
      for (int r = 0; r < std::max(2, reps / 2); ++r) {
        const double t0 = now_s();
        cpu::linear_trellis(pool, x.data(), gemm_T, tw, nullptr, y.data(), kernel);
        gbest = std::min(gbest, now_s() - t0);
      }
      gflops = 2.0 * double(gemm_T) * double(s.N) * double(s.K) / gbest / 1e9;
    }
    std::printf("%-13s %-9s %6lld x %-5lld %-4d | %-19s %9.3f %7.2f | %-21s %8s\n", s.model, s.name, (long long)s.N, (long long)s.K, axis,
                cpu::trellis_kernel_label(kernel, decode_T).c_str(), double(s.N * s.K) / best / 1e9, double(words * 4) / best / 1e9,
                gflops > 0 ? cpu::trellis_kernel_label(kernel, gemm_T).c_str() : "-", gflops > 0 ? fmt::format("{:.1f}", gflops).c_str() : "-");
    std::fflush(stdout);
  }
  return 0;
}

int cmd_bench_linear(const std::vector<std::string>& argv) {
  arbor::cli::Args args(argv, {"threads", "model", "dtype", "reps", "gemm-tokens", "bw-mib", "decode-tokens", "isa", "device", "bits",
                               "group-size", "cpu-gemm", "format", "axis"},
                        {});
  const std::string device = args.get_or("device", "cpu");
  ARBOR_CHECK(device == "cpu" || device == "cuda", "bench-linear: --device must be cpu or cuda, got '{}'", device);
  if (device == "cuda") return bench_linear_cuda(args);
  const int threads = int(args.get_int("threads", ThreadPool::default_threads()));
  const std::string model = args.get_or("model", "all");
  const int reps = int(args.get_int("reps", 5));
  const int64_t gemm_T = args.get_int("gemm-tokens", 512);
  const int64_t decode_T = args.get_int("decode-tokens", 1);
  const size_t bw_bytes = size_t(args.get_int("bw-mib", 1024)) << 20;
  const auto dtype = arbor::dtype_from_name(args.get_or("dtype", "BF16") == "bf16" ? "BF16"
                                            : args.get_or("dtype", "BF16") == "f16" ? "F16"
                                            : args.get_or("dtype", "BF16") == "f32" ? "F32"
                                                                                     : args.get_or("dtype", "BF16"));
  ARBOR_CHECK(dtype && (*dtype == DType::F32 || *dtype == DType::F16 || *dtype == DType::BF16),
              "bench-linear: --dtype must be bf16, f16 or f32");
  ARBOR_CHECK(threads >= 1 && reps >= 1 && gemm_T >= 0 && decode_T >= 1 && decode_T <= cpu::kLinearGemvMaxT,
              "bench-linear: need --threads >= 1, --reps >= 1, --gemm-tokens >= 0, --decode-tokens 1..{}",
              cpu::kLinearGemvMaxT);
  // --bits: MLX affine weights (scales and biases in --dtype).
  const int bits = int(args.get_int("bits", 0)), group = int(args.get_int("group-size", 64));
  const bool affine = bits != 0;
  // Prefill as the CPU backend runs it in this mode (dense: gemm_bf16 where it applies; affine: bf16 panels).
  const cpu::GemmMode gemm_mode = cpu::parse_gemm_mode(args.get_or("cpu-gemm", "exact"), "--cpu-gemm");
  const bool dense_bf16_gemm = gemm_mode == cpu::GemmMode::Bf16 && cpu::gemm_bf16_applies(*dtype);
  ARBOR_CHECK(!affine || ((bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8) &&
                          (group == 32 || group == 64 || group == 128)),
              "bench-linear: --bits must be 2, 3, 4, 5, 6 or 8 and --group-size 32, 64 or 128 (got {} and {})", bits, group);
  std::vector<LinearShape> shapes;
  for (const auto& s : kShapes)
    if (model == "all" || model == s.model) shapes.push_back(s);
  ARBOR_CHECK(!shapes.empty(), "bench-linear: unknown --model '{}' (qwen3-0.6b, llama-3.2-1b, all)", model);

  const std::string format = args.get_or("format", "dense");
  ARBOR_CHECK(format == "dense" || format == "trellis", "bench-linear: --format must be dense or trellis, got '{}'", format);
  if (format == "trellis") {
    const int k = int(args.get_int("bits", 2));
    ARBOR_CHECK(k >= 2 && k <= 4, "bench-linear: --bits {} (trellis: 2, 3, 4)", k);
    const int axis = int(args.get_int("axis", 1));
    ARBOR_CHECK(axis == 0 || axis == 1, "bench-linear: --axis {} (0 or 1)", axis);
    return bench_trellis(shapes, threads, reps, decode_T, gemm_T, k, args.get_or("isa", ""), axis);
  }
  // --isa forces one kernel level (default: the best this CPU supports, as linear() picks).
  const std::vector<cpu::LinearIsa> isas = cpu::linear_isas_supported();
  cpu::LinearIsa isa = isas.back();
  if (auto name = args.get("isa")) {
    std::string known;
    bool found = false;
    for (cpu::LinearIsa i : isas) {
      known += ' ';
      known += cpu::linear_isa_name(i);
      if (cpu::linear_isa_name(i) == *name) isa = i, found = true;
    }
    ARBOR_CHECK(found, "bench-linear: --isa '{}' not supported here (supported:{})", *name, known);
  }
  ThreadPool pool(threads);
  const auto& f = cpu::cpu_features();
  const std::string wdesc = affine ? fmt::format("affine {}-bit g{} weights ({} scales)", bits, group, arbor::dtype_name(*dtype))
                                   : fmt::format("{} weights", arbor::dtype_name(*dtype));
  std::printf("bench-linear: %s [%s], %d thread(s), %s\n", f.brand.c_str(), f.summary().c_str(), threads, wdesc.c_str());
  std::fflush(stdout);
  // The machine may be shared: bandwidth passes are interleaved with the decode passes, and every
  // fraction is taken against the best bandwidth pass of the whole run (the strictest yardstick).
  cpu::ReadBandwidthProbe probe(pool, bw_bytes);
  probe.pass();

  struct Row {
    const LinearShape* s;
    double gbs = 0;     // best decode pass, GB/s of weights
    double gflops = 0;  // best prefill call
    double paired = 0;  // decode GB/s / bandwidth, each averaged over the same interleaved passes
    double dense_gflops = 0;  // affine runs: the dense GEMM (--dtype weights) on the same shape
    size_t bytes = 0;   // weight bytes one decode call reads
  };
  std::vector<Row> rows;
  const size_t esize = arbor::dtype_size(*dtype);
  const float* x_data = nullptr;
  for (const auto& s : shapes) {
    // Affine: the packed copies are what the timed calls read; the dense copies only give the GEMM for
    // comparison (one copy).
    std::optional<AffineCopies> aw;
    if (affine) aw.emplace(pool, s.N, s.K, bits, group, *dtype, size_t(768) << 20);
    const bool gemm = gemm_T > 0 && s.per_layer > 0;
    WeightCopies w(pool, s.N, s.K, *dtype, affine ? 0 : size_t(768) << 20, affine ? (gemm ? 1 : 0) : 2);
    const size_t wbytes = affine ? aw->bytes() : size_t(s.N * s.K) * esize;
    const size_t n_copies = affine ? aw->codes.size() : w.bufs.size();
    auto dense = [&](int64_t T, size_t c, float* y) {
      if (T > cpu::kLinearGemvMaxT && dense_bf16_gemm)
        cpu::gemm_bf16(pool, x_data, T, s.K, w.bufs[c].data(), *dtype, s.N, nullptr, y);
      else
        cpu::linear_with_isa(isa, pool, x_data, T, s.K, w.bufs[c].data(), *dtype, s.N, nullptr, y);
    };
    auto run = [&](int64_t T, size_t c, float* y) {
      if (affine)
        cpu::linear_affine_with_isa(isa, pool, x_data, T, aw->matrix(c % n_copies), nullptr, y, gemm_mode);
      else
        dense(T, c % n_copies, y);
    };
    std::vector<float> x(size_t(std::max(gemm_T, decode_T) * s.K));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7919 % 2001) - 1000) * 1e-3f + 1e-4f;
    x_data = x.data();
    std::vector<float> y(size_t(std::max(gemm_T, decode_T) * s.N));
    // Decode: enough calls per pass to stream ~2 GiB; the best pass counts.
    const int64_t calls = std::max<int64_t>(int64_t(n_copies), int64_t((size_t(2) << 30) / wbytes));
    double best = 1e30, gemv_time = 0, probe_time = 0;
    for (int r = 0; r < reps; ++r) {
      probe_time += double(bw_bytes) / probe.pass();
      const double t0 = now_s();
      for (int64_t c = 0; c < calls; ++c) run(decode_T, size_t(c), y.data());
      const double t = now_s() - t0;
      gemv_time += t;
      best = std::min(best, t / double(calls));
    }
    Row row{&s, double(wbytes) / best / 1e9};
    row.bytes = wbytes;
    // Averages over the same interleaved time slices: on a loaded machine the steadier comparison.
    row.paired = (double(wbytes) * double(calls) * reps / gemv_time) / (double(bw_bytes) * reps / probe_time);
    // Prefill: a few calls of gemm_T tokens (skipped for lm_head: logits are computed for one row).
    if (gemm) {
      double gbest = 1e30, dbest = 1e30;
      for (int r = 0; r < std::max(2, reps / 2); ++r) {
        double t0 = now_s();
        run(gemm_T, 0, y.data());
        gbest = std::min(gbest, now_s() - t0);
        if (affine) {
          t0 = now_s();
          dense(gemm_T, 0, y.data());
          dbest = std::min(dbest, now_s() - t0);
        }
      }
      row.gflops = 2.0 * double(gemm_T) * double(s.N) * double(s.K) / gbest / 1e9;
      if (affine) row.dense_gflops = 2.0 * double(gemm_T) * double(s.N) * double(s.K) / dbest / 1e9;
    }
    rows.push_back(row);
  }
  probe.pass();
  const double bw = probe.best();
  std::printf("read bandwidth: %.2f GB/s (best of %d passes over %zu MiB, interleaved with the runs below)\n\n",
              bw / 1e9, 2 + reps * int(shapes.size()), bw_bytes >> 20);
  std::printf("decode: best pass in GB/s of weights streamed; 'of bw' = that / best bandwidth pass; 'paired' =\n"
              "mean decode rate / mean bandwidth over the same interleaved passes (steadier when the machine is busy)\n\n");
  auto kname = [&](int64_t T) {
    if (affine) return cpu::linear_affine_kernel_name(isa, T, gemm_mode, bits);
    return T > cpu::kLinearGemvMaxT && dense_bf16_gemm ? std::string("avx512bf16-gemm-bf16") : cpu::linear_kernel_name(isa, *dtype, T);
  };
  std::printf("%-13s %-9s %-14s | T=%-2lld %-21s %7s %6s %6s | T=%-4lld %-21s %8s%s\n", "model", "linear", "N x K",
              (long long)decode_T, "kernel", "GB/s", "of bw", "paired", (long long)gemm_T, "kernel", "GFLOP/s",
              affine ? fmt::format(" {:>12}", fmt::format("dense {}", arbor::dtype_name(*dtype))).c_str() : "");
  for (const Row& row : rows) {
    const LinearShape& s = *row.s;
    std::printf("%-13s %-9s %6lld x %-5lld | %-26s %7.2f %5.1f%% %5.1f%% | %-28s %8s%s\n", s.model, s.name,
                (long long)s.N, (long long)s.K, kname(decode_T).c_str(), row.gbs,
                100.0 * row.gbs * 1e9 / bw, 100.0 * row.paired, row.gflops > 0 ? kname(gemm_T).c_str() : "-",
                row.gflops > 0 ? fmt::format("{:.1f}", row.gflops).c_str() : "-",
                affine ? fmt::format(" {:>12}", row.dense_gflops > 0 ? fmt::format("{:.1f}", row.dense_gflops) : "-").c_str() : "");
  }
  // A decoder layer's linears in sequence (each weight read once per token): the figure that decides
  // decode speed, time-weighted over the shapes above.
  std::printf("\n");
  for (const char* m : {"qwen3-0.6b", "llama-3.2-1b"}) {
    double bytes = 0, secs = 0;
    for (const auto& r : rows) {
      if (std::string(r.s->model) != m || r.s->per_layer == 0) continue;
      const double b = double(r.bytes) * r.s->per_layer;
      bytes += b;
      secs += b / (r.gbs * 1e9);
    }
    if (secs > 0)
      std::printf("%-13s one layer's linears at T=%lld: %.2f GB/s = %.1f%% of read bandwidth\n", m,
                  (long long)decode_T, bytes / secs / 1e9, 100.0 * bytes / secs / bw);
  }
  return 0;
}

}  // namespace

ARBOR_VERB("bench-linear", "benchmark the linear kernels at model shapes (GB/s, % of bandwidth, GFLOP/s)", "[flags]",
           "  --device cpu|cuda     cpu (default): the CPU kernels below; cuda: the affine (--format trellis: the\n"
           "                        trellis, down on axis 0) decode GEMV at Llama-3.1-8B's shapes against the\n"
           "                        measured copy bandwidth\n"
           "  --model NAME          shapes of qwen3-0.6b, llama-3.2-1b or all (default all)\n"
           "  --dtype bf16|f16|f32  weight type (default bf16); with --bits, of the scales and biases\n"
           "  --bits B              MLX affine weights of B bits (2, 3, 4, 5, 6, 8); GB/s count codes, scales\n"
           "                        and biases; the prefill column adds the dense --dtype GEMM (cuda: default 4,\n"
           "                        bf16 scales/biases; --decode-tokens may list rows, 1,8)\n"
           "  --group-size G        affine group size (32, 64, 128; default 64)\n"
           "  --cpu-gemm exact|bf16 prefill as the CPU backend runs it in that mode (default exact); with --bits\n"
           "                        2/4/8 (3/5/6 with AVX-512 VBMI) and bf16, decode too (the int8-activation GEMV)\n"
           "  --threads N           threads (default: every CPU this process may run on)\n"
           "  --reps N              passes per shape, the best reported (default 5)\n"
           "  --decode-tokens N     rows of the decode (GEMV) calls (default 1)\n"
           "  --gemm-tokens N       rows of the prefill (GEMM) calls; 0 skips them (default 512)\n"
           "  --bw-mib N            buffer of the read-bandwidth passes, MiB (default 1024)\n"
           "  --isa NAME            force one kernel level (default: the best this CPU has)\n"
           "  --format dense|trellis  trellis: the trellis kernels on random code words (--bits 2/3/4, default 2;\n"
           "                        down on axis 0); --isa reference|avx2|avx512\n"
           "  --axis 0|1            trellis: the linears other than down on axis 0 or 1 (default 1)\n",
           cmd_bench_linear);
