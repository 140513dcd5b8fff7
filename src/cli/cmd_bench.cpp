// `arbor bench`: prefill and decode speed of a model (usually --dummy-weights with a real config),
// with the hardware ceiling measured in the same run (CPU: read bandwidth and the dot-product peak, and
// where the prefill time goes; CUDA: device copy bandwidth and the cuBLAS bf16 GEMM rate) and each
// figure's fraction of it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <tuple>

#include "backend/cpu/bandwidth.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/linear.h"
#include "cli/build_info.h"
#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "engine/generate.h"
#ifdef ARBOR_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace arbor::cli {
namespace {

using Clock = std::chrono::steady_clock;
[[maybe_unused]] double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// FLOPs of one forward over `n` new tokens at positions [start, start + n): 2 per weight per token for
// every matmul weight (the embedding is a gather; the LM head runs for `logit_rows` rows only), plus
// attention's q·k and p·v (2 + 2 per head_dim per visible key).
double forward_flops(const Model& m, int64_t start, int64_t n, int64_t logit_rows) {
  const ModelConfig& c = m.config();
  const double embed = double(c.vocab_size) * double(c.hidden_size);
  const double body = double(m.parameter_count()) - embed * (c.tie_word_embeddings ? 1.0 : 2.0);
  double keys = 0;
  for (int64_t p = start; p < start + n; ++p) keys += double(c.sliding_window > 0 ? std::min<int64_t>(p + 1, c.sliding_window) : p + 1);
  return 2.0 * body * double(n) + 2.0 * embed * double(logit_rows) + 4.0 * double(c.n_heads * c.head_dim * c.n_layers) * keys;
}

// --decode-only's figures: one (--decode-batch B, default 1; --decode-ctx N, default 512), or
// --decode-runs B@CTX,B@CTX,...
std::vector<std::pair<int64_t, int64_t>> parse_decode_runs(const Args& a) {
  const bool decode_only = a.has("decode-only");
  const int64_t only_batch = a.get_int("decode-batch", 1), only_ctx = a.get_int("decode-ctx", 512);
  if (only_batch < 1 || only_batch > 64) fail("arguments: --decode-batch must be in 1..64, got {}", only_batch);
  if (only_ctx < 1 || only_ctx > 131072) fail("arguments: --decode-ctx must be in 1..131072, got {}", only_ctx);
  std::vector<std::pair<int64_t, int64_t>> only_runs = {{only_batch, only_ctx}};
  if (a.has("decode-runs")) {
    if (!decode_only) fail("arguments: --decode-runs needs --decode-only");
    only_runs.clear();
    const std::string spec = a.get_or("decode-runs", "");
    for (size_t i = 0; i <= spec.size();) {
      size_t j = spec.find(',', i);
      if (j == std::string::npos) j = spec.size();
      const std::string e = spec.substr(i, j - i);
      const size_t at = e.find('@');
      int64_t B = 0, ctx = 0;
      try {
        if (at == std::string::npos) throw std::invalid_argument(e);
        B = std::stoll(e.substr(0, at)), ctx = std::stoll(e.substr(at + 1));
      } catch (const std::exception&) {
        fail("arguments: --decode-runs: '{}' is not BATCH@CONTEXT (e.g. 1@8192,32@4096)", e);
      }
      if (B < 1 || B > 64 || ctx < 1 || ctx > 131072) fail("arguments: --decode-runs: '{}': batch 1..64, context 1..131072", e);
      only_runs.push_back({B, ctx});
      i = j + 1;
    }
  }
  return only_runs;
}

// --kv-sweep A/B/...: each decode figure once per KV-cache spec, in one process (the weights loaded
// once, the KV pools reallocated with each spec's codecs); without it, --kv-cache's one spec.
std::vector<std::string> parse_kv_sweep(const Args& a) {
  std::vector<std::string> kv_specs;
  const std::string sweep = a.get_or("kv-sweep", "");
  for (size_t i = 0; i < sweep.size();) {
    size_t j = sweep.find('/', i);
    if (j == std::string::npos) j = sweep.size();
    if (j > i) kv_specs.push_back(sweep.substr(i, j - i));
    i = j + 1;
  }
  if (!kv_specs.empty() && a.has("kv-cache")) fail("arguments: --kv-sweep and --kv-cache exclude each other");
  return kv_specs;
}

// The KV pools again with `spec`'s codecs (the weights stay; the old pools are freed).
void realloc_kv(Backend& be, const ModelConfig& c, const std::string& spec) {
  KVLayout kv = be.kv_layout();
  kv.codecs.clear();
  if (spec != "bf16") kv.codecs = resolve_kv_cache_spec(spec, c.n_layers, c.head_dim);
  be.alloc_kv(kv);
}

#ifdef ARBOR_HAS_CUDA

// --device cuda: ceilings first, then prefill (512, 2048, 8192 tokens), batch-1 decode at contexts 512
// and 8192, and decode at batch 8, 32, 64 (context 512 each). Every figure with its fraction of the
// roofline: decode against the bytes a step must read at the measured copy bandwidth, prefill against
// the measured cuBLAS bf16 rate.
int bench_cuda(const Args& a) {
  const int64_t steps = a.get_int("decode-tokens", 64);
  const int reps = int(a.get_int("reps", 3));
  if (steps < 1 || reps < 1) fail("arguments: --decode-tokens and --reps must be >= 1");
  // --decode-only: one decode figure (graph replay) per --decode-runs entry (or --decode-batch at
  // --decode-ctx), e.g. under a profiler or to compare settings.
  const bool decode_only = a.has("decode-only");
  const std::vector<std::pair<int64_t, int64_t>> only_runs = parse_decode_runs(a);
  const std::vector<std::string> kv_specs = parse_kv_sweep(a);
  // --decode-only at a context past 8192 (KV-cache codecs at 32k) sizes the model's context and the
  // KV pool for it.
  int64_t max_only_ctx = 0;
  for (auto [B, ctx] : only_runs) max_only_ctx = std::max(max_only_ctx, ctx);
  const int64_t batch_ctx = 512, long_ctx = decode_only ? std::max<int64_t>(8192, max_only_ctx) : 8192;
  // --prefill-only P[,P...]: prefill figures of P tokens only (no GEMV table, no decode), e.g. under
  // a profiler or to compare settings.
  std::vector<int64_t> prefill_only;
  if (a.has("prefill-only"))
    for (int32_t P : parse_id_list(a.get_or("prefill-only", ""), "prefill-only", "a token count")) {
      if (P < 1 || P > 8192) fail("arguments: --prefill-only: {} tokens (1..8192)", P);
      prefill_only.push_back(P);
    }
  if (!prefill_only.empty() && decode_only) fail("arguments: --prefill-only and --decode-only exclude each other");
  const bool one_figure = decode_only || !prefill_only.empty();
  const std::vector<int64_t> prefills = decode_only            ? std::vector<int64_t>{}
                                        : !prefill_only.empty() ? prefill_only
                                                                : std::vector<int64_t>{512, 2048, 8192};
  const std::vector<int64_t> batches = {8, 32, 64};
  if (!a.has("model") && !a.has("config")) fail("arguments: --model DIR (or --config FILE with --dummy-weights) is required");
  LoadOptions opt = load_options_from_args(a);  // --dummy-weights with --dtype, --bits/--group-size
  opt.ctx_size = long_ctx + steps + 16;
  opt.max_step_tokens = long_ctx;
  opt.block_size = 16;
  if (!kv_specs.empty()) opt.kv_cache = kv_specs[0];  // --kv-sweep: the first codec; later ones reload
  const int64_t per_seq = (batch_ctx + steps + 16 + 15) / 16;
  opt.kv_blocks = std::max<int64_t>(batches.back() * per_seq, (opt.ctx_size + 15) / 16) + 8;
  if (decode_only)
    for (auto [B, ctx] : only_runs) opt.kv_blocks = std::max<int64_t>(opt.kv_blocks, B * ((ctx + steps + 16 + 15) / 16 + 1) + 8);
  auto backend = make_cuda_backend(0);
  auto t0 = Clock::now();
  Model m(opt, *backend);
  const double load_s = seconds_since(t0);
  const ModelConfig& c = m.config();
  std::printf("build      arbor %s (%s)\n", build_commit(), build_config());
  std::printf("model      %s\n", c.summary().c_str());
  std::printf("backend    %s\n", backend->name().c_str());
  std::printf("weights    %.3f GB (%s), loaded in %.2f s%s\n", double(m.weight_bytes()) * 1e-9, m.weight_dtypes().c_str(), load_s,
              opt.dummy_weights ? " (dummy weights generated on the host)" : "");
  std::printf("matrices   %s; %llu parameters\n", m.weight_formats().c_str(), (unsigned long long)m.parameter_count());
  std::printf("kernels    prefill attention %s (ARBOR_CUDA_ATTN_PREFILL)\n", CudaBackend::prefill_kernel(int(c.head_dim)));
  // What the device holds, as the driver counts it (every process; the CUDA context and library handles
  // included): after the load, and after the runs (the KV pool, activations, graphs, scratch such as the
  // quantized prefill's decoded slices).
  auto device_memory = [&](const char* when) {
    const CudaMemory mem = cuda_device_memory();
    std::printf("device mem %.2f GB in use of %.2f GB %s (weights %.3f GB, KV pool %.3f GB)\n", double(mem.used) * 1e-9,
                double(mem.total) * 1e-9, when, double(m.weight_bytes()) * 1e-9,
                double(backend->kv_layout().n_blocks) * double(backend->kv_layout().block_size) *
                    double(backend->kv_layout().bytes_per_token(backend->kv_dtype())) * 1e-9);
  };
  device_memory("after the load");
  const double bw = cuda_measure_copy_bandwidth(), gemm = cuda_measure_bf16_gemm_rate(8192);
  std::printf("ceilings   copy %.1f GB/s (read + write, measured now); cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s (random data)\n", bw * 1e-9,
              gemm * 1e-12);

  // GEMV alone on this model's shapes (weights rotated past L2), at 1 and 8 rows, for three K-split
  // occupancy targets: where the decode step's time goes, layer by layer.
  const std::vector<std::tuple<const char*, int64_t, int64_t>> shapes = {
      {"q", c.q_dim(), c.hidden_size}, {"k/v", c.kv_dim(), c.hidden_size}, {"o", c.hidden_size, c.q_dim()},
      {"gate/up", c.intermediate_size, c.hidden_size}, {"down", c.hidden_size, c.intermediate_size}, {"lm_head", c.vocab_size, c.hidden_size}};
  if (!one_figure)
    std::printf("gemv       shape: GB/s (fraction of copy bw) for warps/SM target 32 (default) | 64 | 128 (the register kernel's K\n"
                "           split; at T=1 with K %% 256 == 0 the streaming kernel runs, the same in each column)\n");
  for (auto [name, N, K] : one_figure ? decltype(shapes){} : shapes)
    for (int64_t T : {1, 8}) {
      std::printf("  %-8s [%lld x %lld] T=%lld:", name, (long long)N, (long long)K, (long long)T);
      for (int w : {32, 64, 128}) {
        const double sec = cuda_time_gemv(N, K, T, w), gbs = double(N * K * 2) / sec;
        std::printf("  %7.0f (%4.1f%%, %.1f us)", gbs * 1e-9, 100.0 * gbs / bw, sec * 1e6);
      }
      std::printf("\n");
    }
  // The same, T=1, one weight copy read back to back: what a GEMV whose weight L2 already holds takes.
  for (auto [name, N, K] : one_figure ? decltype(shapes){} : shapes) {
    if (double(N * K * 2) > 64e6) continue;
    const double sec = cuda_time_gemv(N, K, 1, 32, 20, true), gbs = double(N * K * 2) / sec;
    std::printf("  %-8s [%lld x %lld] T=1, weight hot in L2: %7.0f GB/s (%.1f us)\n", name, (long long)N, (long long)K, gbs * 1e-9, sec * 1e6);
  }
  std::fflush(stdout);
  if (a.has("gemv-only")) return 0;

  const int64_t V = c.vocab_size;
  const uint64_t embed_bytes = m.embed_bytes();
  const uint64_t weight_step_bytes = m.weight_bytes() - (c.tie_word_embeddings ? 0 : embed_bytes);
  double kv_token_bytes = double(backend->kv_layout().bytes_per_token(backend->kv_dtype()));
  std::string kv_label = kv_specs.empty() ? "" : " kv " + opt.kv_cache;
  BlockPool pool(backend->kv_layout().n_blocks, backend->kv_layout().block_size);
  std::vector<float> logits;
  struct Row {
    std::string what;
    double value, fraction;
    std::string unit, note;
  };
  std::vector<Row> rows;
  auto ids_for = [&](int64_t n, int64_t salt) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 7919 + 13 + salt * 104729) % V);
    return ids;
  };
  auto forward = [&](const BatchInfo& b) {
    logits.resize(b.logit_rows.size() * size_t(V));
    m.forward(b, logits.data());
  };

  // Each measurement prints its row at once (a run cut short keeps what it measured); a failed one
  // is reported and the rest go on.
  auto add_row = [&](Row r) {
    std::printf("  %-22s %8.1f %-5s %6.1f%% of roofline  %s\n", r.what.c_str(), r.value, r.unit.c_str(), 100.0 * r.fraction, r.note.c_str());
    std::fflush(stdout);
    rows.push_back(std::move(r));
  };
  auto guarded = [&](const std::string& what, const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      std::printf("  %-22s FAILED: %s\n", what.c_str(), e.what());
      std::fflush(stdout);
    }
  };

  // Prefill: one forward over the whole prompt (median of reps after one warm-up).
  for (int64_t P : prefills) guarded(fmt::format("prefill {}", P), [&] {
    SequenceKV seq;
    seq.long_rope = m.long_rope_for(P);  // a prompt past a longrope model's original context, as served
    if (!seq.reserve(pool, P)) fail("bench: {} tokens need more KV blocks than the pool's {}", P, pool.free_blocks());
    BatchInfo b = make_batch({ids_for(P, 1)}, {0}, {&seq}, false);
    forward(b);
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      auto s0 = Clock::now();
      forward(b);
      t.push_back(seconds_since(s0));
    }
    std::sort(t.begin(), t.end());
    const double sec = t[t.size() / 2], flops = forward_flops(m, 0, P, 1);
    seq.release(pool);
    add_row({fmt::format("prefill {}", P), double(P) / sec, flops / sec / gemm, "tok/s",
             fmt::format("{:.1f} TFLOP/s, {:.1f} ms", flops / sec * 1e-12, sec * 1e3)});
  });

  // Decode: `steps` timed steps (after 4 warm-up steps) over sequences already prefilled to ctx.
  auto* cuda_be = dynamic_cast<CudaBackend*>(backend.get());
  auto decode = [&](int64_t B, int64_t ctx, bool graph) {
    cuda_be->set_step_graphs(graph);
    std::vector<SequenceKV> seqs(static_cast<size_t>(B));
    struct Release {  // the blocks go back to the pool even when a step throws
      std::vector<SequenceKV>& s;
      BlockPool& p;
      ~Release() {
        for (auto& q : s) q.release(p);
      }
    } release{seqs, pool};
    const int64_t total = steps + 4;  // 4 warm-up steps
    for (auto& s : seqs)
      if (!s.reserve(pool, ctx + total + 8)) fail("bench: batch {} at context {} needs more KV blocks than the pool has", B, ctx);
    const int64_t per_chunk = std::max<int64_t>(1, long_ctx / ctx);
    for (int64_t s0 = 0; s0 < B; s0 += per_chunk) {  // prefill, several sequences per forward
      std::vector<std::vector<int32_t>> toks;
      std::vector<int64_t> start;
      std::vector<const SequenceKV*> kv;
      for (int64_t s = s0; s < std::min(B, s0 + per_chunk); ++s) toks.push_back(ids_for(ctx, s)), start.push_back(0), kv.push_back(&seqs[size_t(s)]);
      forward(make_batch(toks, start, kv, false));
    }
    for (auto& s : seqs) s.length = ctx;
    std::vector<int32_t> next(static_cast<size_t>(B), 1);
    // A decode step's batch: each sequence's next token at its length + ahead; `picked`: the tokens are
    // the ids the previous step picked, still on the GPU (token_from_last_pick).
    auto step_batch = [&](int64_t ahead, bool picked) {
      std::vector<std::vector<int32_t>> toks;
      std::vector<int64_t> start;
      std::vector<const SequenceKV*> kv;
      for (int64_t s = 0; s < B; ++s)
        toks.push_back({picked ? token_from_last_pick(s) : next[size_t(s)]}), start.push_back(seqs[size_t(s)].length + ahead),
            kv.push_back(&seqs[size_t(s)]);
      BatchInfo b = make_batch(toks, start, kv, false);
      b.set_row_kind(true);
      return b;
    };
    // The steps as the server runs them: greedy ids picked on the GPU (the logits stay there), and the
    // next step queued, its tokens those ids, before the host waits for this step's ids.
    Clock::time_point warm{};
    {
      BatchInfo b = step_batch(0, false);
      m.forward(b, nullptr);
      cuda_be->argmax_rows_start(m.device_logits(B));
    }
    for (int64_t i = 0; i < total; ++i) {
      if (i + 1 < total) {
        BatchInfo b = step_batch(1, true);
        m.forward(b, nullptr);
        cuda_be->argmax_rows_start(m.device_logits(B));
      }
      cuda_be->wait_pick(next.data());
      for (auto& s : seqs) s.length += 1;
      if (i == 3) warm = Clock::now();
    }
    const double step_s = seconds_since(warm) / double(steps);
    // Diagnostics, over the same positions again (their KV rewritten). Each step waiting for its ids
    // before the next is queued (as before the pipelining).
    for (auto& s : seqs) s.length = ctx;
    double waited_s = 0;
    for (int64_t i = 0; i < total; ++i) {
      BatchInfo b = step_batch(0, false);
      auto s0 = Clock::now();
      m.forward(b, nullptr);
      cuda_be->argmax_rows(m.device_logits(B), next.data());
      if (i >= 4) waited_s += seconds_since(s0);
      for (auto& s : seqs) s.length += 1;
    }
    waited_s /= double(steps);
    // The same step queued `steps` times with no pick of ids (it rewrites one position's KV each
    // time): the GPU's time per step when the host never stalls it.
    double queued_s = 0;
    {
      BatchInfo b = step_batch(0, false);
      cuda_be->synchronize();
      auto s0 = Clock::now();
      for (int64_t i = 0; i < steps; ++i) m.forward(b, nullptr);
      cuda_be->synchronize();
      queued_s = seconds_since(s0) / double(steps);
    }
    cuda_be->set_step_graphs(true);
    const double mid = double(ctx) + double(steps) / 2 + 4;
    const double bytes = double(weight_step_bytes) + double(B) * mid * kv_token_bytes;
    add_row({fmt::format("decode b={} ctx={}{}{}", B, ctx, graph ? "" : " eager", kv_label), double(B) / step_s, bytes / step_s / bw, "tok/s",
             fmt::format("{:.3f} ms/step (each waiting for its ids {:.3f}, queued without ids {:.3f}), {:.0f} MB/step, roofline {:.1f} tok/s",
                         step_s * 1e3, waited_s * 1e3, queued_s * 1e3, bytes * 1e-6, double(B) * bw / bytes)});
  };
  // Each decode figure with the decode step replayed as a CUDA graph (the default), then eagerly.
  for (bool graph : {true, false}) {
    if (!prefill_only.empty() || (decode_only && !graph)) break;
    auto runs = std::vector<std::pair<int64_t, int64_t>>{{1, batch_ctx}, {1, long_ctx}, {8, batch_ctx}, {32, batch_ctx}, {64, batch_ctx}};
    if (graph) runs.insert(runs.begin() + 2, {{2, batch_ctx}, {4, batch_ctx}});
    if (decode_only) runs = only_runs;
    for (size_t k = 0; k < std::max<size_t>(1, kv_specs.size()); ++k) {
      if (k > 0) {  // the next spec's pools (the weights stay; the old pools are freed)
        realloc_kv(*backend, c, kv_specs[k]);
        kv_token_bytes = double(backend->kv_layout().bytes_per_token(backend->kv_dtype()));
        kv_label = " kv " + kv_specs[k];
      }
      if (!kv_specs.empty())
        std::printf("kv cache   %s: %.0f bytes per token\n", kv_specs[k].c_str(), kv_token_bytes);
      for (auto [B, ctx] : runs)
        guarded(fmt::format("decode b={} ctx={}{}", B, ctx, kv_label), [&] { decode(B, ctx, graph); });
    }
  }

  device_memory("after the runs");
  std::printf("\n%-22s %12s %9s  %s\n", "measurement", "value", "roofline", "detail (decode: fraction of copy bw; prefill: of cuBLAS rate)");
  for (auto& r : rows)
    std::printf("%-22s %8.1f %-5s %7.1f%%  %s\n", r.what.c_str(), r.value, r.unit.c_str(), 100.0 * r.fraction, r.note.c_str());
  return 0;
}
#endif


// CPU --decode-only: decode steps at long contexts without prefilling them. Each sequence's KV for
// positions 0 .. ctx-1 is written straight through the backend's kv_write (so coded layers go through
// the codec's encoder) from deterministic random rows (unit Gaussians, one 256-token chunk of rows
// reused for every chunk and layer), then --decode-tokens steps of one token per sequence are timed
// (after 2 warm-up steps; the best of --reps runs, each paired with a read-bandwidth pass just before
// it). Per figure: tok/s, ms/step, the bytes a step reads (weights + KV of the context) and its
// fraction of the read bandwidth. --kv-sweep runs every figure per KV-cache spec in one process.
int bench_cpu_decode_only(const Args& a) {
  const int64_t steps = a.get_int("decode-tokens", 16);
  const int reps = int(a.get_int("reps", 3));
  if (steps < 1 || reps < 1) fail("arguments: --decode-tokens and --reps must be >= 1");
  const std::vector<std::pair<int64_t, int64_t>> runs = parse_decode_runs(a);
  std::vector<std::string> kv_specs = parse_kv_sweep(a);
  LoadOptions opt = load_options_from_args(a);
  int64_t max_ctx = 0, max_batch = 1, blocks = 8;
  for (auto [B, ctx] : runs)
    max_ctx = std::max(max_ctx, ctx), max_batch = std::max(max_batch, B), blocks = std::max(blocks, B * ((ctx + steps + 8 + 15) / 16 + 1) + 8);
  opt.ctx_size = max_ctx + steps + 16;
  opt.max_step_tokens = max_batch;
  opt.block_size = 16;
  opt.kv_blocks = blocks;
  if (!kv_specs.empty()) opt.kv_cache = kv_specs[0];
  auto backend = make_backend_from_args(a);
  auto* cpu_be = dynamic_cast<CpuBackend*>(backend.get());
  if (!cpu_be) fail("bench: --decode-only needs the cpu or cuda device");
  auto t0 = Clock::now();
  Model m(opt, *backend);
  const double load_s = seconds_since(t0);
  const ModelConfig& c = m.config();
  std::printf("build      arbor %s (%s)\n", build_commit(), build_config());
  std::printf("model      %s\n", c.summary().c_str());
  std::printf("backend    %s\n", backend->name().c_str());
  std::printf("weights    %.3f GB (%s), loaded in %.2f s\n", double(m.weight_bytes()) * 1e-9, m.weight_dtypes().c_str(), load_s);
  std::printf("decode     --decode-only: KV of the context written through kv_write from random rows (no prefill), %lld steps "
              "timed, best of %d\n",
              (long long)steps, reps);
  cpu::ReadBandwidthProbe probe(cpu_be->pool());
  probe.pass();  // warm-up (page faults)
  const uint64_t embed_bytes = m.embed_bytes();
  const double weight_bytes = double(m.weight_bytes() - (c.tie_word_embeddings ? 0 : embed_bytes));
  const int64_t H = c.n_kv_heads, hd = c.head_dim, row = H * hd, chunk = 256;
  std::vector<float> rows_k(size_t(chunk * row)), rows_v(rows_k.size());
  {
    std::mt19937 rng(7);
    std::normal_distribution<float> N;
    for (auto& x : rows_k) x = N(rng);
    for (auto& x : rows_v) x = N(rng);
  }
  std::vector<float> logits;
  if (kv_specs.empty()) kv_specs.push_back(opt.kv_cache.empty() ? "bf16" : opt.kv_cache);
  struct Row {
    std::string what;
    double tps, ms, mb, frac, paired;
  };
  std::vector<Row> table;
  for (size_t k = 0; k < kv_specs.size(); ++k) {
    if (k > 0) realloc_kv(*backend, c, kv_specs[k]);
    const DType plain = backend->kv_dtype();
    const double kv_token_bytes = double(backend->kv_layout().bytes_per_token(plain));
    std::printf("kv cache   %s: %s, %.0f bytes per token\n", kv_specs[k].c_str(), backend->kv_layout().codec_summary(plain).c_str(),
                kv_token_bytes);
    for (auto [B, ctx] : runs) {
      BlockPool pool(backend->kv_layout().n_blocks, backend->kv_layout().block_size);
      std::vector<SequenceKV> seqs(static_cast<size_t>(B));
      for (auto& sq : seqs)
        if (!sq.reserve(pool, ctx + steps + 8)) fail("bench: batch {} at context {} needs more KV blocks than the pool has", B, ctx);
      // The context's KV, every layer, 256 positions of one sequence per kv_write.
      auto w0 = Clock::now();
      for (int64_t s = 0; s < B; ++s)
        for (int64_t p0 = 0; p0 < ctx; p0 += chunk) {
          const int64_t n = std::min(chunk, ctx - p0);
          BatchInfo b = make_batch({std::vector<int32_t>(size_t(n), 0)}, {p0}, {&seqs[size_t(s)]}, false);
          backend->begin_batch(b);
          for (int64_t l = 0; l < c.n_layers; ++l)
            backend->kv_write(l, Tensor(rows_k.data(), DType::F32, {n, row}), Tensor(rows_v.data(), DType::F32, {n, row}));
        }
      const double fill_s = seconds_since(w0);
      auto step_batch = [&](int64_t i) {
        std::vector<std::vector<int32_t>> toks;
        std::vector<int64_t> start;
        std::vector<const SequenceKV*> kv;
        for (int64_t s = 0; s < B; ++s)
          toks.push_back({int32_t((s * 7919 + i * 104729 + 13) % c.vocab_size)}), start.push_back(ctx + i), kv.push_back(&seqs[size_t(s)]);
        BatchInfo b = make_batch(toks, start, kv, false);
        b.set_row_kind(true);
        return b;
      };
      auto forward = [&](const BatchInfo& b) {
        logits.resize(b.logit_rows.size() * size_t(c.vocab_size));
        m.forward(b, logits.data());
      };
      for (int64_t i = 0; i < 2; ++i) forward(step_batch(i));  // warm-up
      double best = 1e30, paired = 0;
      for (int r = 0; r < reps; ++r) {
        const double bw_now = probe.pass();
        auto s0 = Clock::now();
        for (int64_t i = 0; i < steps; ++i) forward(step_batch(i));
        const double step = seconds_since(s0) / double(steps);
        best = std::min(best, step);
        const double bytes = weight_bytes + double(B) * (double(ctx) + double(steps) / 2) * kv_token_bytes;
        paired = std::max(paired, bytes / step / bw_now);
      }
      for (auto& sq : seqs) sq.release(pool);
      const double bw = probe.best();
      const double bytes = weight_bytes + double(B) * (double(ctx) + double(steps) / 2) * kv_token_bytes;
      Row r{fmt::format("b={} ctx={} kv {}", B, ctx, kv_specs[k]), double(B) / best, best * 1e3, bytes * 1e-6, bytes / best / bw, paired};
      std::printf("  decode %-26s %8.2f tok/s  %8.2f ms/step  %7.1f MB/step (KV %.1f)  %5.1f%% of best read bw %.1f GB/s, %5.1f%% "
                  "paired  (fill %.1f s)\n",
                  r.what.c_str(), r.tps, r.ms, r.mb, double(B) * (double(ctx) + double(steps) / 2) * kv_token_bytes * 1e-6, 100.0 * r.frac,
                  bw * 1e-9, 100.0 * r.paired, fill_s);
      std::fflush(stdout);
      table.push_back(r);
    }
  }
  std::printf("\n%-34s %9s %9s %9s %8s %8s\n", "decode", "tok/s", "ms/step", "MB/step", "bw best", "paired");
  for (const Row& r : table)
    std::printf("%-34s %9.2f %9.2f %9.1f %7.1f%% %7.1f%%\n", r.what.c_str(), r.tps, r.ms, r.mb, 100.0 * r.frac, 100.0 * r.paired);
  std::printf("(bytes: weights %.1f MB + the KV of the context at its mid-run length; the plain CPU cache stores f32)\n", weight_bytes * 1e-6);
  return 0;
}

int cmd_bench(const std::vector<std::string>& args) {
  auto vf = model_value_flags();
  vf.insert({"prompt-tokens", "decode-tokens", "chunk", "reps", "decode-batch", "decode-ctx", "decode-runs", "kv-sweep", "prefill-only"});
  auto bf = model_bool_flags();
  bf.insert("decode-only");
  bf.insert("gemv-only");
  Args a(args, vf, bf);
  if (a.get_or("device", "cpu") == "cuda") {
#ifdef ARBOR_HAS_CUDA
    return bench_cuda(a);
#else
    fail("arguments: --device cuda: this build has no CUDA backend (configure with nvcc available)");
#endif
  }
  if (a.has("decode-only")) return bench_cpu_decode_only(a);
  if (a.has("kv-sweep") || a.has("decode-runs")) fail("arguments: --kv-sweep and --decode-runs need --decode-only on the CPU");
  const int64_t prompt = a.get_int("prompt-tokens", 128);
  const int64_t decode = a.get_int("decode-tokens", 32);
  const int64_t chunk = a.get_int("chunk", 128);
  const int reps = int(a.get_int("reps", 3));
  if (prompt < 1 || decode < 1 || chunk < 1 || reps < 1) fail("arguments: --prompt-tokens, --decode-tokens, --chunk, --reps must be >= 1");

  LoadedModel lm = load_model_from_args(a, chunk);
  Model& m = *lm.model;
  const ModelConfig& c = m.config();
  if (prompt + decode > m.ctx_size()) fail("bench: {} + {} tokens exceed the context {} (--ctx-size)", prompt, decode, m.ctx_size());
  std::printf("build      arbor %s (%s)\n", build_commit(), build_config());
  std::printf("model      %s\n", c.summary().c_str());
  std::printf("backend    %s\n", lm.backend->name().c_str());
  std::printf("weights    %.3f GB (%s), loaded in %.2f s\n", double(m.weight_bytes()) * 1e-9, m.weight_dtypes().c_str(), lm.load_seconds);
  std::printf("matrices   %s; %llu parameters\n", m.weight_formats().c_str(), (unsigned long long)m.parameter_count());
  {
    // The plain cache holds the backend's kv_dtype() (f32 on the CPU, where `--kv-cache bf16` means plain).
    const DType plain = lm.backend->kv_dtype();
    std::printf("kv cache   %s: %lld bytes per token (codecs: %s%s)\n", lm.backend->kv_layout().codec_summary(plain).c_str(),
                (long long)lm.backend->kv_layout().bytes_per_token(plain),
                kv_bytes_per_codec(c.n_layers, c.n_kv_heads, c.head_dim, int64_t(dtype_size(plain))).c_str(),
                plain == DType::BF16 ? "" : "; the plain cache here stores f32, the bf16 entry counts it");
  }

  // The ceiling, measured now and between the decode runs: on a shared VM the bandwidth moves from
  // second to second, so each decode run is paired with the bandwidth pass just before it.
  auto* cpu_be = dynamic_cast<CpuBackend*>(lm.backend.get());
  std::unique_ptr<cpu::ReadBandwidthProbe> probe;
  cpu::DotPeak peak;
  if (cpu_be) {
    probe = std::make_unique<cpu::ReadBandwidthProbe>(cpu_be->pool());
    probe->pass();  // warm-up (page faults)
    // The prefill ceiling: the core's dot-product rate on the same threads, measured now.
    peak = cpu::measure_dot_peak(cpu_be->pool());
    // The matmul weights' type: the first of weight_dtypes() ("BF16" or "BF16, F32": norms in f32).
    const std::string wts = m.weight_dtypes();
    const DType wt = dtype_from_name(wts.substr(0, wts.find(','))).value_or(DType::F32);
    const bool bf16_gemm = cpu_be->gemm_mode() == cpu::GemmMode::Bf16 && cpu::gemm_bf16_applies(wt);
    if (m.weight_formats().rfind("dense", 0) != 0)  // mostly quantized matrices: they take their format's kernels
      std::printf("gemm       %s matrices: the CPU kernels of their format; dense ones below\n", m.weight_formats().c_str());
    std::printf("gemm       --cpu-gemm %s: prefill linears run %s (decode: %s)\n", std::string(cpu::gemm_mode_name(cpu_be->gemm_mode())).c_str(),
                bf16_gemm ? "bf16-x (x rounded to bf16, vdpbf16ps)" : cpu::linear_kernel_name(wt, std::min(chunk, prompt)).c_str(),
                cpu::linear_kernel_name(wt, 1).c_str());
    std::printf("dot peak   %.1f GFLOP/s (%s, %d threads, measured now)\n", peak.flops * 1e-9, peak.what.c_str(), peak.threads);
  }

  // Bytes one decode step must read: every weight except the embedding table (one row is gathered;
  // when tied, the table is read in full as the LM head), plus the KV cache of the context.
  const uint64_t embed_bytes = m.embed_bytes();
  const uint64_t step_bytes = m.weight_bytes() - (c.tie_word_embeddings ? 0 : embed_bytes);
  const int64_t mid_ctx = prompt + decode / 2;
  const uint64_t kv_bytes = uint64_t(lm.backend->kv_layout().bytes_per_token(lm.backend->kv_dtype()) * mid_ctx);
  const double bytes = double(step_bytes + kv_bytes);

  BlockPool pool(lm.backend->kv_layout().n_blocks, lm.backend->kv_layout().block_size);
  std::vector<int32_t> ids(static_cast<size_t>(prompt));
  for (int64_t i = 0; i < prompt; ++i) ids[size_t(i)] = int32_t((i * 7919 + 13) % c.vocab_size);
  double best_prefill = 1e30, best_decode = 1e30, paired = 0;
  for (int r = 0; r < reps; ++r) {
    const double bw_now = probe ? probe->pass() : 0;
    GenerateRequest req;
    req.prompt = ids;
    req.max_tokens = decode + 1;  // decode steps = decode
    GenerateResult res = generate(m, pool, req);
    best_prefill = std::min(best_prefill, res.prefill_seconds);
    const double step = res.decode_seconds / double(std::max<int64_t>(1, res.decode_steps));
    best_decode = std::min(best_decode, step);
    if (bw_now > 0) paired += bytes / step / bw_now / reps;
  }
  const double bw = probe ? std::max(probe->best(), probe->pass()) : 0;
  const double decode_tps = 1.0 / best_decode;
  CpuBackend::PhaseTimes dph;  // the timed run's decode steps (below)
  double timed_decode_s = 0;
  int64_t timed_steps = 0;
  if (bw > 0) std::printf("read bw    %.2f GB/s (best pass, measured now, %d threads)\n", bw * 1e-9, cpu_be->pool().size());
  std::printf("prefill    %lld tokens: %.1f tok/s (chunks of %lld)\n", (long long)prompt, double(prompt) / best_prefill, (long long)chunk);
  if (cpu_be && peak.flops > 0) {
    // The peak again, after the runs: on a shared host one measurement can lose time to a neighbour,
    // so the fractions use the better of the two (both printed).
    const cpu::DotPeak again = cpu::measure_dot_peak(cpu_be->pool());
    std::printf("dot peak   %.1f GFLOP/s after the runs; fractions below use %.1f (the better)\n", again.flops * 1e-9,
                std::max(peak.flops, again.flops) * 1e-9);
    peak.flops = std::max(peak.flops, again.flops);
    // Where the time goes: one more run with the backend's phase timers on, their totals taken at the first token
    // (the prefill's) and again at the end (the decode steps').
    cpu_be->reset_phase_times();
    cpu_be->set_phase_timing(true);
    GenerateRequest req;
    req.prompt = ids;
    req.max_tokens = decode + 1;
    CpuBackend::PhaseTimes ph;
    bool first = true;
    GenerateResult res = generate(m, pool, req, [&](int32_t) {
      if (first) ph = cpu_be->phase_times(), cpu_be->reset_phase_times(), first = false;
      return true;
    });
    cpu_be->set_phase_timing(false);
    dph = cpu_be->phase_times();
    timed_decode_s = res.decode_seconds, timed_steps = res.decode_steps;
    const double flops = forward_flops(m, 0, prompt, 1);
    std::printf("prefill    %.1f GFLOP/s = %.1f%% of the dot peak (%.2f GFLOP per prompt: matmul weights + attention)\n",
                flops / best_prefill * 1e-9, 100.0 * flops / best_prefill / peak.flops, flops * 1e-9);
    const double total = res.prefill_seconds, rest = std::max(0.0, total - ph.linear_s - ph.attention_s);
    std::printf("prefill    time %.1f ms (timed run): linears %.1f ms (%.0f%%, %.1f GFLOP/s = %.1f%% of peak), attention %.1f ms "
                "(%.0f%%), rest %.1f ms (%.0f%%)\n",
                total * 1e3, ph.linear_s * 1e3, 100.0 * ph.linear_s / total, ph.linear_flops / ph.linear_s * 1e-9,
                100.0 * ph.linear_flops / ph.linear_s / peak.flops, ph.attention_s * 1e3, 100.0 * ph.attention_s / total, rest * 1e3,
                100.0 * rest / total);
  }
  std::printf("decode     %.2f tok/s at context %lld; %.1f MB/step (weights %.1f + KV %.1f)\n", decode_tps, (long long)mid_ctx,
              bytes * 1e-6, double(step_bytes) * 1e-6, double(kv_bytes) * 1e-6);
  if (bw > 0) {
    const double achieved = bytes * decode_tps;
    std::printf("decode bw  %.2f GB/s = %.1f%% of the best bandwidth pass; %.1f%% paired (each run vs the pass before it); "
                "roofline %.2f tok/s\n",
                achieved * 1e-9, 100.0 * achieved / bw, 100.0 * paired, bw / bytes);
  }
  if (timed_steps > 0 && dph.linear_s > 0) {
    const double n = double(timed_steps), step = timed_decode_s / n, lin = dph.linear_s / n, att = dph.attention_s / n;
    const double rest = std::max(0.0, step - lin - att), lin_bw = dph.linear_bytes / dph.linear_s;
    std::printf("decode     time %.2f ms a step (timed run, %lld steps): linears %.2f ms (%.0f%%, %.2f GB/s%s), attention %.2f ms "
                "(%.0f%%), rest %.2f ms (%.0f%%)\n",
                step * 1e3, (long long)timed_steps, lin * 1e3, 100.0 * lin / step, lin_bw * 1e-9,
                bw > 0 ? fmt::format(" = {:.1f}% of the best bandwidth pass", 100.0 * lin_bw / bw).c_str() : "", att * 1e3, 100.0 * att / step,
                rest * 1e3, 100.0 * rest / step);
  }
  return 0;
}

ARBOR_VERB("bench", "prefill/decode speed vs the measured hardware limit (--config FILE --dummy-weights)",
           "(--model DIR | --config FILE --dummy-weights) [flags]",
           ARBOR_MODEL_FLAGS_HELP
           "  --prompt-tokens N     CPU: prompt length (default 128)\n"
           "  --chunk N             CPU: prompt tokens per forward step (default 128)\n"
           "  --decode-tokens N     decode steps timed (default 32 on the CPU, 16 with --decode-only; 64 on CUDA)\n"
           "  --reps N              runs per figure: the best reported on the CPU, the median of CUDA's\n"
           "                        prefill runs (default 3)\n"
           "  --decode-only         decode figures only (CUDA: graph replay; CPU: the context's KV written from random rows\n"
           "                        through the codecs' encoders instead of a prefill), e.g. under a profiler\n"
           "  --decode-batch B      with --decode-only: sequences per step (1..64, default 1)\n"
           "  --decode-ctx N        with --decode-only: context length (1..131072, default 512)\n"
           "  --decode-runs B@N,... with --decode-only: several (batch, context) figures, e.g. 1@8192,32@4096\n"
           "  --kv-sweep A/B/...    every decode figure once per --kv-cache spec (e.g. bf16/affine8/k8v3), one process\n"
           "                        (CPU: with --decode-only)\n"
           "  --prefill-only P,...  CUDA: prefill figures for these prompt lengths only (1..8192 each)\n"
           "  --gemv-only           CUDA: stop after the ceilings and the GEMV table at the model's shapes\n",
           cmd_bench);

}  // namespace
}  // namespace arbor::cli
