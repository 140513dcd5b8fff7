// Trellis encoder benchmark: relative MSE ||W - W^||^2 / ||W||^2 of an i.i.d. Gaussian matrix at k = 2, 3, 4,
// and encode speed in weights per second, per Viterbi ISA (and the GPU's, "cuda", in a CUDA build with a
// device: the whole trellis_encode_stored with the scales, targets and packing on the CPU threads) and
// thread count; each encoder's words are checked against the first's. Optionally how far QTIP's
// rotate-by-T/2 tail-biting is from the exact optimum (--exact-blocks N).
// Usage: bench_trellis [--rows 256] [--cols 4096] [--threads 2] [--reps 3] [--isa all|scalar|avx2|avx512|cuda|a,b,...]
//                      [--exact-blocks 0] [--seed 1] [--gain 0]   (gain 0: the encoder's default per k; 1: RMS ratio)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "quant/trellis.h"
#include "quant/trellis_encode.h"
#ifdef ARBOR_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/trellis.h"
#endif

using namespace arbor;
using namespace arbor::quant;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_trellis [--rows N] [--cols N] [--threads N] [--reps N] [--isa all|scalar|avx2|avx512|cuda|a,b,...] "
               "[--exact-blocks N] [--seed N] [--gain G]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 256, cols = 4096;
  int threads = 2, reps = 3, exact_blocks = 0;
  uint32_t seed = 1;
  float gain = 0.0f;
  std::string isa_arg = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    if (a == "--rows") rows = std::atoll(v);
    else if (a == "--cols") cols = std::atoll(v);
    else if (a == "--threads") threads = std::atoi(v);
    else if (a == "--reps") reps = std::atoi(v);
    else if (a == "--isa") isa_arg = v;
    else if (a == "--exact-blocks") exact_blocks = std::atoi(v);
    else if (a == "--seed") seed = uint32_t(std::atoll(v));
    else if (a == "--gain") gain = float(std::atof(v));
    else return usage();
  }
  if (rows < 1 || cols < 256 || cols % 256 || threads < 1 || reps < 1) return usage();

  // The encoders to run: each supported CPU ISA asked for, then the GPU's (cuda: the block Viterbi hook).
  struct Encoder {
    TrellisIsa isa;
    bool cuda;
  };
  std::vector<Encoder> isas;
  // --isa takes one name, "all", or a comma-separated list (avx512,cuda: the GPU's words checked against AVX-512's).
  auto asked = [&](const std::string& name) {
    if (isa_arg == "all") return true;
    const std::string list = "," + isa_arg + ",";
    return list.find("," + name + ",") != std::string::npos;
  };
  for (TrellisIsa isa : {TrellisIsa::scalar, TrellisIsa::avx2, TrellisIsa::avx512})
    if (trellis_isa_supported(isa) && asked(trellis_isa_name(isa))) isas.push_back({isa, false});
#ifdef ARBOR_HAS_CUDA
  if (asked("cuda") && cuda_device_available(nullptr)) isas.push_back({trellis_best_isa(), true});
#endif
  if (isas.empty()) {
    std::fprintf(stderr, "bench_trellis: ISA '%s' is not supported here\n", isa_arg.c_str());
    return 2;
  }

  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(size_t(rows * cols));
  for (float& x : w) x = normal(rng);
  double norm = 0;
  for (float x : w) norm += double(x) * x;

  std::printf("matrix [%lld, %lld] i.i.d. Gaussian, seed %u; %d thread(s), best of %d\n", (long long)rows,
              (long long)cols, seed, threads, reps);
  ThreadPool pool(threads);
  for (int k : {2, 3, 4}) {
    std::vector<uint32_t> first_words;
    for (const Encoder& e : isas) {
      const TrellisIsa isa = e.isa;
      double best = 1e30, total = 0;
      TrellisEncoded enc;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        TrellisEncodeOptions opt;
        opt.scale_gain = gain;
        opt.isa = isa;
#ifdef ARBOR_HAS_CUDA
        if (e.cuda)
          opt.block_viterbi = cuda::cuda_trellis_viterbi;
#endif
        enc = trellis_encode_stored("bench", w.data(), rows, cols, k, 1, &pool, opt);
        const double s = seconds_since(t0);
        best = std::min(best, s), total += s;
      }
      if (first_words.empty()) first_words = enc.words;
      const std::vector<float> dec = trellis_decode_linear(enc.geometry, enc.words.data(), enc.scales.data());
      double err = 0, err_ls = 0;
      for (size_t i = 0; i < w.size(); ++i) err += std::pow(double(w[i]) - dec[i], 2);
      // The same paths with each row's least-squares scale <w, v> / <v, v> instead of the RMS ratio:
      // what refitting the scale after the Viterbi would gain (the format's encoder keeps the RMS ratio).
      for (int64_t r = 0; r < rows; ++r) {
        double wv = 0, vv = 0;
        for (int64_t c = 0; c < cols; ++c) wv += double(w[size_t(r * cols + c)]) * dec[size_t(r * cols + c)],
                                           vv += double(dec[size_t(r * cols + c)]) * dec[size_t(r * cols + c)];
        const double a = vv > 0 ? wv / vv : 0;
        for (int64_t c = 0; c < cols; ++c) err_ls += std::pow(double(w[size_t(r * cols + c)]) - a * dec[size_t(r * cols + c)], 2);
      }
      const double n = double(rows * cols);
      std::printf("k=%d gain %.2f %-7s rel MSE %.5f (LS scale %.5f)  %7.3f Mweights/s best, %7.3f mean  (%.3f s best)%s\n", k,
                  gain > 0 ? gain : trellis_default_scale_gain(k), e.cuda ? "cuda" : trellis_isa_name(isa), err / norm, err_ls / norm, n / best / 1e6, n * reps / total / 1e6, best,
                  enc.words == first_words ? "" : "  WORDS DIFFER FROM THE FIRST ISA");
    }
    if (exact_blocks > 0) {  // rotate (Algorithm 4) vs the exact tail-biting optimum, in code units
      TrellisViterbi vit(TrellisParams{k, 12, 256});
      const double rms = trellis_code_rms(12);
      std::vector<float> x(256);
      std::vector<uint16_t> states(256);
      double rot = 0, exact = 0, sum_sq = 0;
      int optimal = 0;
      const int64_t blocks = std::min<int64_t>(exact_blocks, rows * cols / 256);
      for (int64_t b = 0; b < blocks; ++b) {
        const float* row = w.data() + b * 256;  // blocks of consecutive rows' first columns
        const float scale = f16_to_f32(
            trellis_row_scale(w.data() + (b * 256 / cols) * cols, cols, rms, gain > 0 ? gain : trellis_default_scale_gain(k)));
        for (int t = 0; t < 256; ++t) x[size_t(t)] = row[t] / scale, sum_sq += double(x[size_t(t)]) * x[size_t(t)];
        const double r = vit.encode_block(x.data(), states.data(), TailBiting::rotate);
        const double e = vit.encode_block(x.data(), states.data(), TailBiting::exact);
        rot += r, exact += e, optimal += r <= e * (1 + 1e-9);
      }
      std::printf("k=%d tail-biting over %lld blocks: rotate rel MSE %.5f, exact %.5f (rotate optimal in %d)\n", k,
                  (long long)blocks, rot / sum_sq, exact / sum_sq, optimal);
    }
  }
  return 0;
}
