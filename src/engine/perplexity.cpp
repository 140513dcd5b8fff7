// Perplexity over windows, batched through Model::forward, and the top-K logits file for KL.
#include "engine/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generate.h"

namespace arbor {

std::vector<PplWindow> perplexity_windows(int64_t n_ids, int64_t ctx) {
  ARBOR_CHECK(ctx >= 2, "perplexity: a window needs at least 2 ids (--ctx {})", ctx);
  std::vector<PplWindow> w;
  for (int64_t b = 0; b < n_ids; b += ctx) {
    const int64_t len = std::min(ctx, n_ids - b);
    if (len >= 2) w.push_back({b, len});
  }
  return w;
}

int64_t perplexity_kv_blocks(int64_t ctx, int64_t step_tokens, int64_t block_size) {
  ARBOR_CHECK(ctx >= 2 && step_tokens >= 1 && block_size >= 1, "perplexity: ctx {}, step {}, block size {}", ctx, step_tokens, block_size);
  const int64_t window_blocks = (ctx - 1 + block_size - 1) / block_size;
  const int64_t in_flight = (step_tokens + ctx - 2) / (ctx - 1) + 1;
  return window_blocks * in_flight + 1;
}

int64_t predicted_tokens(std::span<const PplWindow> windows) {
  int64_t n = 0;
  for (const auto& w : windows) n += w.length - 1;
  return n;
}

uint64_t ids_hash(std::span<const int32_t> ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    const uint32_t u = uint32_t(id);
    for (int k = 0; k < 4; ++k) {
      h ^= (u >> (8 * k)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

PplSummary summarize_nll(std::span<const double> nll) {
  PplSummary s;
  s.tokens = int64_t(nll.size());
  if (nll.empty()) return s;
  // Pairwise-free but compensated: Neumaier summation keeps the sum exact to ~1 ulp for 1e6 terms.
  double sum = 0, comp = 0;
  for (double v : nll) {
    const double t = sum + v;
    comp += std::fabs(sum) >= std::fabs(v) ? (sum - t) + v : (v - t) + sum;
    sum = t;
  }
  s.nll_sum = sum + comp;
  s.mean_nll = s.nll_sum / double(s.tokens);
  s.perplexity = std::exp(s.mean_nll);
  if (s.tokens > 1) {
    double ss = 0;
    for (double v : nll) ss += (v - s.mean_nll) * (v - s.mean_nll);
    s.perplexity_stderr = s.perplexity * std::sqrt(ss / double(s.tokens - 1) / double(s.tokens));
  }
  return s;
}

RowLse row_lse(const float* x, int64_t V) {
  RowLse r;
  float m = x[0];
  int32_t am = 0;
  for (int64_t j = 1; j < V; ++j)
    if (x[j] > m) m = x[j], am = int32_t(j);
  ARBOR_CHECK(std::isfinite(m), "perplexity: a row of logits has no finite maximum ({}): the forward produced NaN or inf", m);
  double s = 0;
  for (int64_t j = 0; j < V; ++j) s += std::exp(double(x[j]) - double(m));
  ARBOR_CHECK(std::isfinite(s), "perplexity: a row of logits sums to {} (NaN in the forward?)", s);
  r.max = double(m);
  r.lse = double(m) + std::log(s);
  r.argmax = am;
  return r;
}

namespace {

// The tail: sum of exp(x - max) over ids not marked, as log of its share of the row's mass.
double log_rest_mass(const float* x, int64_t V, const RowLse& l, const uint8_t* mark) {
  double rest = 0;
  for (int64_t j = 0; j < V; ++j)
    if (!mark[j]) rest += std::exp(double(x[j]) - l.max);
  return rest > 0 ? std::log(rest) + l.max - l.lse : -std::numeric_limits<double>::infinity();
}

}  // namespace

void topk_record(const float* x, int64_t V, const RowLse& l, int32_t target, int top_k, TopKScratch& s, TopKRecord& out) {
  const int64_t K = std::min<int64_t>(top_k, V);
  s.heap.resize(size_t(V));
  for (int64_t j = 0; j < V; ++j) s.heap[size_t(j)] = {x[j], int32_t(j)};
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(s.heap.begin(), s.heap.begin() + K, s.heap.end(), better);
  out.ids.resize(size_t(K));
  out.logp.resize(size_t(K));
  if (s.mark.size() != size_t(V)) s.mark.assign(size_t(V), 0);
  for (int64_t k = 0; k < K; ++k) {
    const int32_t id = s.heap[size_t(k)].second;
    out.ids[size_t(k)] = id;
    out.logp[size_t(k)] = float(double(x[id]) - l.lse);
    s.mark[size_t(id)] = 1;
  }
  out.log_rest = float(log_rest_mass(x, V, l, s.mark.data()));
  for (int64_t k = 0; k < K; ++k) s.mark[size_t(out.ids[size_t(k)])] = 0;
  out.nll = float(l.lse - double(x[target]));
}

double kl_topk(const float* x, int64_t V, const RowLse& l, const int32_t* base_ids, const float* base_logp, float base_log_rest, int top_k,
               TopKScratch& s) {
  if (s.mark.size() != size_t(V)) s.mark.assign(size_t(V), 0);
  double kl = 0;
  for (int k = 0; k < top_k; ++k) {
    const int32_t id = base_ids[k];
    const float lq = float(double(x[id]) - l.lse);
    const double lp = double(base_logp[k]);
    kl += std::exp(lp) * (lp - double(lq));
    s.mark[size_t(id)] = 1;
  }
  const float lqr = float(log_rest_mass(x, V, l, s.mark.data()));
  for (int k = 0; k < top_k; ++k) s.mark[size_t(base_ids[k])] = 0;
  if (std::isfinite(base_log_rest)) kl += std::exp(double(base_log_rest)) * (double(base_log_rest) - double(lqr));
  return kl;
}

// ---- logits file ----

namespace {

template <class T>
void put(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}
template <class T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::vector<uint8_t> header_bytes(const PplLogitsHeader& h) {
  std::vector<uint8_t> b(PplLogitsHeader::kFixedBytes + h.meta.size(), 0);
  std::memcpy(b.data(), PplLogitsHeader::kMagic, 8);
  put<uint32_t>(b, 8, h.version);
  put<uint32_t>(b, 12, h.top_k);
  put<uint32_t>(b, 16, h.vocab);
  put<uint32_t>(b, 20, h.ctx);
  put<uint64_t>(b, 24, h.n_ids);
  put<uint64_t>(b, 32, h.n_predicted);
  put<uint64_t>(b, 40, h.ids_hash);
  put<double>(b, 48, h.nll_sum);
  put<uint32_t>(b, 56, uint32_t(h.meta.size()));
  std::memcpy(b.data() + PplLogitsHeader::kFixedBytes, h.meta.data(), h.meta.size());
  return b;
}

}  // namespace

PplLogitsWriter::PplLogitsWriter(const std::string& path, const PplLogitsHeader& h) : path_(path), h_(h) {
  ARBOR_CHECK(h.top_k >= 1, "perplexity: top-K of the logits file must be at least 1");
  // Written to PATH.tmp and renamed by finish(), so a run that fails leaves no file that looks whole.
  f_ = std::fopen((path_ + ".tmp").c_str(), "wb");
  ARBOR_CHECK(f_, "perplexity: cannot write {}.tmp: {}", path_, std::strerror(errno));
  auto b = header_bytes(h_);
  ARBOR_CHECK(std::fwrite(b.data(), 1, b.size(), f_) == b.size(), "perplexity: short write to {}.tmp", path_);
  buf_.resize(h_.record_bytes());
}

PplLogitsWriter::~PplLogitsWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove((path_ + ".tmp").c_str());
  }
}

void PplLogitsWriter::write(int64_t index, const TopKRecord& r) {
  ARBOR_CHECK(index >= 0 && uint64_t(index) < h_.n_predicted && r.ids.size() == h_.top_k,
              "perplexity: record {} of {} with {} entries (top-K {})", index, h_.n_predicted, r.ids.size(), h_.top_k);
  const size_t K = h_.top_k;
  put<float>(buf_, 0, r.nll);
  put<float>(buf_, 4, r.log_rest);
  std::memcpy(buf_.data() + 8, r.ids.data(), K * 4);
  std::memcpy(buf_.data() + 8 + K * 4, r.logp.data(), K * 4);
  const int64_t off = int64_t(PplLogitsHeader::kFixedBytes + h_.meta.size()) + index * int64_t(buf_.size());
  ARBOR_CHECK(fseeko(f_, off, SEEK_SET) == 0 && std::fwrite(buf_.data(), 1, buf_.size(), f_) == buf_.size(),
              "perplexity: write to {}.tmp failed at record {}: {}", path_, index, std::strerror(errno));
}

void PplLogitsWriter::finish(double nll_sum) {
  h_.nll_sum = nll_sum;
  auto b = header_bytes(h_);
  const bool ok = fseeko(f_, 0, SEEK_SET) == 0 && std::fwrite(b.data(), 1, b.size(), f_) == b.size();
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  ARBOR_CHECK(ok && closed, "perplexity: writing {}.tmp failed: {}", path_, std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(path_ + ".tmp", path_, ec);
  ARBOR_CHECK(!ec, "perplexity: cannot rename {}.tmp to {}: {}", path_, path_, ec.message());
}

PplLogitsReader::PplLogitsReader(const std::string& path) : path_(path) {
  file_ = MappedFile(path);
  const uint8_t* p = file_.data();
  const size_t n = file_.size();
  ARBOR_CHECK(n >= PplLogitsHeader::kFixedBytes && std::memcmp(p, PplLogitsHeader::kMagic, 8) == 0,
              "perplexity: {} is not an arbor perplexity logits file (it does not start with \"ARBPPLK1\"; make one with "
              "--save-logits)",
              path);
  h_.version = get<uint32_t>(p + 8);
  ARBOR_CHECK(h_.version == PplLogitsHeader::kVersion, "perplexity: {} is a logits file of version {}, this arbor reads version {}", path,
              h_.version, PplLogitsHeader::kVersion);
  h_.top_k = get<uint32_t>(p + 12);
  h_.vocab = get<uint32_t>(p + 16);
  h_.ctx = get<uint32_t>(p + 20);
  h_.n_ids = get<uint64_t>(p + 24);
  h_.n_predicted = get<uint64_t>(p + 32);
  h_.ids_hash = get<uint64_t>(p + 40);
  h_.nll_sum = get<double>(p + 48);
  const uint32_t meta = get<uint32_t>(p + 56);
  ARBOR_CHECK(h_.top_k >= 1 && h_.top_k <= h_.vocab, "perplexity: {}: top-K {} with a vocabulary of {}", path, h_.top_k, h_.vocab);
  ARBOR_CHECK(n >= PplLogitsHeader::kFixedBytes + meta, "perplexity: {} is truncated (its header names {} bytes of metadata)", path, meta);
  h_.meta.assign(reinterpret_cast<const char*>(p + PplLogitsHeader::kFixedBytes), meta);
  data_offset_ = PplLogitsHeader::kFixedBytes + meta;
  const uint64_t want = data_offset_ + h_.n_predicted * h_.record_bytes();
  ARBOR_CHECK(h_.n_predicted < (uint64_t(1) << 40) && uint64_t(n) == want,
              "perplexity: {} has {} bytes, its header ({} records of top-{}) needs {}: truncated or not written whole", path, n,
              h_.n_predicted, h_.top_k, want);
}

void PplLogitsReader::check_matches(uint64_t n_ids, uint64_t hash, uint32_t ctx, uint32_t vocab, uint64_t n_predicted) const {
  ARBOR_CHECK(h_.vocab == vocab, "perplexity: --kl-base {} was made with a vocabulary of {} ids, this model has {}", path_, h_.vocab,
              vocab);
  ARBOR_CHECK(h_.ctx == ctx, "perplexity: --kl-base {} was made with --ctx {}, this run uses --ctx {} (the windows differ)", path_, h_.ctx,
              ctx);
  ARBOR_CHECK(h_.n_ids == n_ids && h_.ids_hash == hash,
              "perplexity: --kl-base {} was made from other token ids ({} ids, hash {:016x}), this run has {} ids, hash {:016x} "
              "(another text or tokenizer)",
              path_, h_.n_ids, h_.ids_hash, n_ids, hash);
  ARBOR_CHECK(h_.n_predicted == n_predicted, "perplexity: --kl-base {} holds {} predicted ids, this run predicts {}", path_,
              h_.n_predicted, n_predicted);
}

float PplLogitsReader::nll(int64_t i) const { return get<float>(file_.data() + data_offset_ + size_t(i) * h_.record_bytes()); }
float PplLogitsReader::log_rest(int64_t i) const {
  return get<float>(file_.data() + data_offset_ + size_t(i) * h_.record_bytes() + 4);
}

void PplLogitsReader::record(int64_t i, std::vector<int32_t>& ids, std::vector<float>& logp, float& nll, float& log_rest) const {
  ARBOR_CHECK(i >= 0 && uint64_t(i) < h_.n_predicted, "perplexity: record {} of {}", i, h_.n_predicted);
  const uint8_t* r = file_.data() + data_offset_ + size_t(i) * h_.record_bytes();
  const size_t K = h_.top_k;
  nll = get<float>(r);
  log_rest = get<float>(r + 4);
  ids.resize(K);
  logp.resize(K);
  std::memcpy(ids.data(), r + 8, K * 4);
  std::memcpy(logp.data(), r + 8 + K * 4, K * 4);
  for (size_t k = 0; k < K; ++k)
    ARBOR_CHECK(ids[k] >= 0 && uint32_t(ids[k]) < h_.vocab, "perplexity: {}: record {} holds id {} outside the vocabulary ({})", path_, i,
                ids[k], h_.vocab);
}

double quantile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(p * double(v.size()));
  const size_t i = size_t(std::clamp(rank, 1.0, double(v.size()))) - 1;
  return v[i];
}

// ---- the run ----

PerplexityResult run_perplexity(Model& model, BlockPool& pool, std::span<const int32_t> ids, const PerplexityOptions& opt) {
  const int64_t V = model.config().vocab_size;
  const int64_t n = int64_t(ids.size());
  for (int64_t i = 0; i < n; ++i)
    ARBOR_CHECK(ids[size_t(i)] >= 0 && ids[size_t(i)] < V, "perplexity: id {} at index {} is outside the model's vocabulary ({})",
                ids[size_t(i)], i, V);
  const std::vector<PplWindow> windows = perplexity_windows(n, opt.ctx);
  ARBOR_CHECK(!windows.empty(), "perplexity: the text has {} id(s); a window needs at least 2", n);
  // A window of L ids feeds its first L - 1 (the last is only predicted): positions 0 .. ctx - 2.
  ARBOR_CHECK(opt.ctx - 1 <= model.ctx_size(), "perplexity: --ctx {} needs {} positions, the model was loaded with {} (--ctx-size)", opt.ctx,
              opt.ctx - 1, model.ctx_size());
  ARBOR_CHECK(pool.blocks_for(std::min<int64_t>(opt.ctx, n) - 1) <= pool.n_blocks(),
              "perplexity: a window of {} ids needs {} KV blocks, the pool has {}", opt.ctx, pool.blocks_for(opt.ctx - 1), pool.n_blocks());
  ARBOR_CHECK(opt.top_k >= 1, "perplexity: --kl-top-k must be at least 1, got {}", opt.top_k);

  std::vector<int64_t> offset(windows.size());  // index of a window's first prediction
  int64_t total = 0;
  for (size_t w = 0; w < windows.size(); ++w) offset[w] = total, total += windows[w].length - 1;

  PerplexityResult res;
  res.n_ids = n;
  res.windows = int64_t(windows.size());
  res.ids_hash = ids_hash(ids);
  res.nll.assign(size_t(total), 0.0);

  std::unique_ptr<PplLogitsReader> base;
  if (!opt.kl_base.empty()) {
    base = std::make_unique<PplLogitsReader>(opt.kl_base);
    base->check_matches(uint64_t(n), res.ids_hash, uint32_t(opt.ctx), uint32_t(V), uint64_t(total));
    res.has_kl = true;
    res.kl.assign(size_t(total), 0.0);
    res.base_meta = base->header().meta;
    res.base_top_k = int(base->header().top_k);
  }
  std::vector<uint8_t> top1(base ? size_t(total) : 0, 0);
  std::vector<double> base_rest(base ? size_t(total) : 0, 0.0);
  const int top_k = int(std::min<int64_t>(opt.top_k, V));
  std::unique_ptr<PplLogitsWriter> writer;
  if (!opt.save_logits.empty()) {
    PplLogitsHeader h;
    h.top_k = uint32_t(top_k);
    h.vocab = uint32_t(V);
    h.ctx = uint32_t(opt.ctx);
    h.n_ids = uint64_t(n);
    h.n_predicted = uint64_t(total);
    h.ids_hash = res.ids_hash;
    h.meta = opt.meta;
    writer = std::make_unique<PplLogitsWriter>(opt.save_logits, h);
  }

  const int64_t step = opt.step_tokens > 0 ? std::min(opt.step_tokens, model.max_step_tokens()) : model.max_step_tokens();
  ThreadPool host(opt.host_threads);
  std::vector<TopKScratch> scratch(size_t(host.size()));
  std::vector<TopKRecord> records(writer ? size_t(step) : 0);
  struct BaseRow {
    std::vector<int32_t> ids;
    std::vector<float> logp;
  };
  std::vector<BaseRow> base_rows(size_t(host.size()));

  struct Active {
    size_t w = 0;
    int64_t fed = 0;
    SequenceKV kv;
  };
  std::vector<std::unique_ptr<Active>> active;
  size_t next = 0;
  int64_t done = 0;
  std::vector<float> logits;
  std::vector<int64_t> row_index, row_target;  // per fed token: its prediction's index and target id
  struct Release {
    BlockPool& p;
    std::vector<std::unique_ptr<Active>>& a;
    ~Release() {
      for (auto& x : a) x->kv.release(p);
    }
  } release{pool, active};

  const auto t0 = std::chrono::steady_clock::now();
  while (next < windows.size() || !active.empty()) {
    int64_t budget = step;
    // Admit windows while their KV fits (each reserves its whole window up front).
    while (next < windows.size()) {
      auto a = std::make_unique<Active>();
      a->w = next;
      // transformers runs the window as one forward of all its L ids: longrope picks its regime from L.
      a->kv.long_rope = model.long_rope_for(windows[next].length);
      if (!a->kv.reserve(pool, windows[next].length - 1)) {
        a->kv.release(pool);
        break;
      }
      active.push_back(std::move(a));
      ++next;
    }
    ARBOR_CHECK(!active.empty(), "perplexity: no KV blocks free for a window");
    std::vector<std::vector<int32_t>> chunks;
    std::vector<int64_t> starts;
    std::vector<const SequenceKV*> kvs;
    std::vector<Active*> fed_by;
    row_index.clear();
    row_target.clear();
    for (auto& a : active) {
      if (budget == 0) break;
      const PplWindow& w = windows[a->w];
      const int64_t m = std::min(budget, w.length - 1 - a->fed);
      const int32_t* src = ids.data() + w.begin + a->fed;
      chunks.emplace_back(src, src + m);
      starts.push_back(a->fed);
      kvs.push_back(&a->kv);
      fed_by.push_back(a.get());
      for (int64_t i = 0; i < m; ++i) {
        row_index.push_back(offset[a->w] + a->fed + i);
        row_target.push_back(ids[size_t(w.begin + a->fed + i + 1)]);
      }
      budget -= m;
    }
    BatchInfo b = make_batch(chunks, starts, kvs, true);
    b.set_row_kind(false);
    const int64_t T = b.n_tokens();
    logits.resize(size_t(T * V));
    model.forward(b, logits.data());

    host.parallel_for(T, 1, [&](int t, int64_t r0, int64_t r1) {
      TopKScratch& s = scratch[size_t(t)];
      for (int64_t r = r0; r < r1; ++r) {
        const float* x = logits.data() + r * V;
        const int64_t g = row_index[size_t(r)];
        const int32_t target = int32_t(row_target[size_t(r)]);
        const RowLse l = row_lse(x, V);
        res.nll[size_t(g)] = l.lse - double(x[target]);
        if (writer) topk_record(x, V, l, target, top_k, s, records[size_t(r)]);
        if (base) {
          BaseRow& br = base_rows[size_t(t)];
          float bnll = 0, brest = 0;
          base->record(g, br.ids, br.logp, bnll, brest);
          res.kl[size_t(g)] = kl_topk(x, V, l, br.ids.data(), br.logp.data(), brest, int(br.ids.size()), s);
          top1[size_t(g)] = br.ids[0] == l.argmax ? 1 : 0;
          base_rest[size_t(g)] = std::isfinite(brest) ? std::exp(double(brest)) : 0.0;
        }
      }
    });
    if (writer)
      for (int64_t r = 0; r < T; ++r) writer->write(row_index[size_t(r)], records[size_t(r)]);

    for (size_t c = 0; c < chunks.size(); ++c) {
      Active* a = fed_by[c];
      a->fed += int64_t(chunks[c].size());
      a->kv.length = a->fed;
    }
    for (size_t i = 0; i < active.size();) {
      if (active[i]->fed == windows[active[i]->w].length - 1) {
        active[i]->kv.release(pool);
        active.erase(active.begin() + int64_t(i));
      } else {
        ++i;
      }
    }
    done += T;
    if (opt.progress) opt.progress(done, total);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.ppl = summarize_nll(res.nll);
  if (writer) writer->finish(res.ppl.nll_sum);
  if (base) {
    double s = 0, mx = 0, agree = 0, rest = 0;
    for (int64_t i = 0; i < total; ++i) {
      s += res.kl[size_t(i)];
      mx = std::max(mx, res.kl[size_t(i)]);
      agree += top1[size_t(i)];
      rest += base_rest[size_t(i)];
    }
    res.kl_mean = s / double(total);
    res.kl_max = mx;
    res.kl_p99 = quantile(res.kl, 0.99);
    res.top1_agreement = agree / double(total);
    res.base_rest_mass_mean = rest / double(total);
    res.ppl_base = std::exp(base->header().nll_sum / double(total));
  }
  return res;
}

}  // namespace arbor
