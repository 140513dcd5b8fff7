// Thread pool with spin-then-sleep wake-up and claim-based chunking.
#include "core/thread_pool.h"

#include <sched.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define ARBOR_PAUSE() _mm_pause()
#else
#define ARBOR_PAUSE() ((void)0)
#endif

namespace arbor {

int ThreadPool::default_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_threads()) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g;
    int spins = 0;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < 20000) {
        ARBOR_PAUSE();
      } else {
        generation_.wait(seen);
      }
    }
    seen = g;
    if (stop_.load()) return;
    claim_chunks(index);
  }
}

// claim_ packs (generation << 40) | (chunks << 20) | next: a worker decides from this one atomic
// whether a chunk is left, and reads the job's other fields only after claiming one (the caller is
// then still waiting for that chunk, so they are this job's and `fn` is alive).
namespace {
constexpr uint64_t kField = (uint64_t(1) << 20) - 1;
}

void ThreadPool::claim_chunks(int thread_index) {
  const uint64_t gen = claim_.load(std::memory_order_acquire) >> 40;
  for (;;) {
    uint64_t cur = claim_.load(std::memory_order_acquire);
    const int64_t c = int64_t(cur & kField), chunks = int64_t((cur >> 20) & kField);
    if ((cur >> 40) != gen || c >= chunks) return;  // a newer job (its own wake-up brings us back), or none left
    if (!claim_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) continue;
    const int64_t b = job_grains_ * c / chunks * job_grain_;
    const int64_t e = std::min(job_n_, job_grains_ * (c + 1) / chunks * job_grain_);
    try {
      if (b < e) (*job_fn_)(thread_index, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> g(err_mutex_);
      if (!job_err_) job_err_ = std::current_exception();
    }
    chunks_done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t grains = (n + grain - 1) / grain;
  const int64_t chunks = std::min<int64_t>(n_threads_, grains);
  if (chunks <= 1) {
    fn(0, 0, n);
    return;
  }
  job_fn_ = &fn;
  job_n_ = n, job_grain_ = grain, job_grains_ = grains;
  job_err_ = nullptr;
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = (claim_.load(std::memory_order_relaxed) >> 40) + 1;
  claim_.store(gen << 40 | uint64_t(chunks) << 20, std::memory_order_release);  // publishes the fields above
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  claim_chunks(0);
  while (chunks_done_.load(std::memory_order_acquire) < chunks) ARBOR_PAUSE();
  if (job_err_) {
    std::exception_ptr e = job_err_;
    job_err_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) {
  parallel_for(n_threads_, 1, [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) fn(int(i));
  });
}

}  // namespace arbor
