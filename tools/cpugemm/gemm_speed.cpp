// Prefill GEMM speed at Llama-3.2-1B's shapes: gemm_bf16 (bf16 x) and linear() (the exact split GEMM),
// GFLOP/s and the fraction of the dot peak measured in the same run, on THREADS threads (argv[1], 2).
// Built by tools/cpugemm/device_test_cpu.sh (SPEED=1); for tuning the blocking, not a test.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/linear.h"

using namespace arbor;

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  ThreadPool pool(threads);
  const cpu::DotPeak peak = cpu::measure_dot_peak(pool, 0.5);
  std::printf("peak %.1f GFLOP/s (%s, %d threads)\n", peak.flops * 1e-9, peak.what.c_str(), threads);
  struct S {
    const char* name;
    int64_t N, K;
  } shapes[] = {{"q/o", 2048, 2048}, {"k/v", 512, 2048}, {"gate/up", 8192, 2048}, {"down", 2048, 8192}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  for (int64_t T : {128, 512, 2048}) {
    for (auto s : shapes) {
      std::vector<float> x(size_t(T * s.K)), y(size_t(T * s.N));
      for (float& v : x) v = d(rng);
      std::vector<uint16_t> w(size_t(s.N * s.K));
      for (auto& v : w) v = f32_to_bf16(d(rng) * 0.03f);
      for (int mode = 0; mode < 2; ++mode) {
        auto run = [&] {
          if (mode == 0) cpu::gemm_bf16(pool, x.data(), T, s.K, w.data(), DType::BF16, s.N, nullptr, y.data());
          else cpu::linear(pool, x.data(), T, s.K, w.data(), DType::BF16, s.N, nullptr, y.data());
        };
        run();
        double best = 1e30;
        for (int r = 0; r < 5; ++r) {
          auto t0 = std::chrono::steady_clock::now();
          run();
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        const double fl = 2.0 * double(T) * double(s.N) * double(s.K) / best;
        std::printf("T=%4lld %-8s %-5s %7.1f GFLOP/s %5.1f%% of peak  %.3f ms\n", (long long)T, s.name, mode == 0 ? "bf16" : "exact",
                    fl * 1e-9, 100 * fl / peak.flops, best * 1e3);
      }
    }
  }
}
