// Perplexity of a token stream over consecutive non-overlapping windows, and the KL divergence of a
// run's next-token distributions against a base run's saved top-K distributions (`arbor perplexity`;
// docs/perplexity.md has the semantics and the logits file format).
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/mmap.h"
#include "kv/block_pool.h"
#include "model/model.h"

namespace arbor {

// Ids [begin, begin + length) of the stream.
struct PplWindow {
  int64_t begin = 0, length = 0;
};

// Consecutive non-overlapping windows of ctx ids over n_ids ids; a last shorter window is kept if it
// has at least 2 ids (a window of one id predicts nothing).
std::vector<PplWindow> perplexity_windows(int64_t n_ids, int64_t ctx);
// Ids predicted over those windows: sum of (length - 1).
int64_t predicted_tokens(std::span<const PplWindow> windows);
// KV blocks a run needs: a window feeds ctx - 1 ids; a step of step_tokens carries the windows it starts plus
// one being finished.
int64_t perplexity_kv_blocks(int64_t ctx, int64_t step_tokens, int64_t block_size);

// FNV-1a 64 over the ids as 4-byte little-endian integers (tools/perplexity/reference_ppl.py has the same).
uint64_t ids_hash(std::span<const int32_t> ids);

// exp(mean NLL) and its standard error by the delta method: ppl * sd(nll) / sqrt(n), sd with n - 1.
struct PplSummary {
  int64_t tokens = 0;
  double nll_sum = 0, mean_nll = 0, perplexity = 0, perplexity_stderr = 0;
};
PplSummary summarize_nll(std::span<const double> nll);

// One row of logits: its log-sum-exp and argmax (first index of the largest value), in double.
struct RowLse {
  double max = 0, lse = 0;  // lse = log sum exp(x), max = the largest x
  int32_t argmax = 0;
};
RowLse row_lse(const float* x, int64_t V);

// ---- The logits file (--save-logits / --kl-base) ----
// Little-endian. A 64-byte header: magic "ARBPPLK1", u32 version, u32 top_k, u32 vocab, u32 ctx,
// u64 n_ids, u64 n_predicted, u64 ids_hash, f64 nll_sum, u32 meta_bytes, u32 0; then meta_bytes of
// UTF-8 JSON (what made the file); then one record per predicted id, in stream order: f32 nll, f32
// log(rest mass), top_k x i32 id, top_k x f32 log p (sorted by log p descending, ties: lower id first).
struct PplLogitsHeader {
  static constexpr char kMagic[8] = {'A', 'R', 'B', 'P', 'P', 'L', 'K', '1'};
  static constexpr uint32_t kVersion = 1;
  uint32_t version = kVersion;
  uint32_t top_k = 0;
  uint32_t vocab = 0;
  uint32_t ctx = 0;
  uint64_t n_ids = 0;        // ids in the tokenized text
  uint64_t n_predicted = 0;  // records
  uint64_t ids_hash = 0;     // ids_hash() of the ids
  double nll_sum = 0;        // the base run's summed NLL (double, for its perplexity)
  std::string meta;          // JSON: model, file, device, ... (informative)

  size_t record_bytes() const { return 8 + size_t(top_k) * 8; }
  static constexpr size_t kFixedBytes = 64;
};

// One row's top-K record computed from logits: what the file stores.
struct TopKRecord {
  float nll = 0, log_rest = 0;
  std::vector<int32_t> ids;
  std::vector<float> logp;
};
// Scratch per thread: a V-byte mark array.
struct TopKScratch {
  std::vector<uint8_t> mark;
  std::vector<std::pair<float, int32_t>> heap;
};
void topk_record(const float* x, int64_t V, const RowLse& l, int32_t target, int top_k, TopKScratch& s, TopKRecord& out);

// KL(base ‖ this) over the base's K ids plus one bucket for the rest, from this run's logits x.
// The K log-probabilities of this run are rounded to f32 as the base's are, so equal logits give 0.
double kl_topk(const float* x, int64_t V, const RowLse& l, const int32_t* base_ids, const float* base_logp, float base_log_rest, int top_k,
               TopKScratch& s);

// Writes records at their index (they arrive out of order when windows run batched).
class PplLogitsWriter {
 public:
  PplLogitsWriter(const std::string& path, const PplLogitsHeader& h);
  ~PplLogitsWriter();
  PplLogitsWriter(const PplLogitsWriter&) = delete;
  PplLogitsWriter& operator=(const PplLogitsWriter&) = delete;
  void write(int64_t index, const TopKRecord& r);
  void finish(double nll_sum);  // rewrites the header's nll_sum, checks and closes

 private:
  std::string path_;
  PplLogitsHeader h_;
  std::FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
};

class PplLogitsReader {
 public:
  // Opens and checks the file's structure (magic, version, size); throws naming the path.
  explicit PplLogitsReader(const std::string& path);
  const PplLogitsHeader& header() const { return h_; }
  // Throws a clear error when the file was made for other ids, windows or vocabulary.
  void check_matches(uint64_t n_ids, uint64_t hash, uint32_t ctx, uint32_t vocab, uint64_t n_predicted) const;
  float nll(int64_t i) const;
  float log_rest(int64_t i) const;
  void record(int64_t i, std::vector<int32_t>& ids, std::vector<float>& logp, float& nll, float& log_rest) const;

 private:
  std::string path_;
  MappedFile file_;
  PplLogitsHeader h_;
  size_t data_offset_ = 0;
};

struct PerplexityOptions {
  int64_t ctx = 512;
  int64_t step_tokens = 0;  // tokens per forward (several windows per step); 0: model.max_step_tokens()
  int host_threads = 0;     // threads for the per-row log-softmax / top-K / KL work (0: all cores)
  std::string save_logits;  // write the base's top-K distributions here
  int top_k = 256;  // docs/perplexity.md: what K buys
  std::string kl_base;      // compare against this file
  std::string meta;         // JSON written into a saved file's header
  std::function<void(int64_t done_tokens, int64_t total_tokens)> progress;
};

struct PerplexityResult {
  PplSummary ppl;
  int64_t n_ids = 0, windows = 0;
  uint64_t ids_hash = 0;
  double seconds = 0;             // forward + row work, not loading
  std::vector<double> nll;        // per predicted id, in stream order
  // With kl_base:
  bool has_kl = false;
  double kl_mean = 0, kl_p99 = 0, kl_max = 0, top1_agreement = 0, ppl_base = 0, base_rest_mass_mean = 0;
  std::vector<double> kl;         // per predicted id
  std::string base_meta;
  int base_top_k = 0;
};

// Runs the windows batched through model.forward (every fed id's logits). The pool must hold
// at least one window's KV; more windows run at once when it holds more.
PerplexityResult run_perplexity(Model& model, BlockPool& pool, std::span<const int32_t> ids, const PerplexityOptions& opt);

// The p-quantile (0..1) of values, by the nearest-rank method on a sorted copy.
double quantile(std::vector<double> values, double p);

}  // namespace arbor
