// Thread pool with spin-then-sleep dispatch.
#include "core/thread_pool.h"

#include <sched.h>

#include <exception>
#include <mutex>

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
    (*task_)(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::dispatch(const std::function<void(int)>& task) {
  if (n_threads_ == 1) {
    task(0);
    return;
  }
  task_ = &task;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  task(0);
  while (pending_.load(std::memory_order_acquire) != 0) ARBOR_PAUSE();
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) {
  std::exception_ptr err;
  std::mutex m;
  dispatch([&](int t) {
    try {
      fn(t);
    } catch (...) {
      std::lock_guard<std::mutex> g(m);
      if (!err) err = std::current_exception();
    }
  });
  if (err) std::rethrow_exception(err);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t chunks = (n + grain - 1) / grain;
  int nt = int(std::min<int64_t>(n_threads_, chunks));
  if (nt <= 1) {
    fn(0, 0, n);
    return;
  }
  // Static split: equal numbers of grains per thread, so the same thread reads the same weights
  // every step (warm caches, stable timing).
  run_on_all([&](int t) {
    if (t >= nt) return;
    int64_t c0 = chunks * t / nt, c1 = chunks * (t + 1) / nt;
    int64_t b = c0 * grain, e = std::min(n, c1 * grain);
    if (b < e) fn(t, b, e);
  });
}

}  // namespace arbor
