// ThreadPool: a fixed set of workers that split index ranges; the caller's thread takes part.
// Dispatch is a generation counter that workers spin on briefly, then sleep on (atomic wait),
// because a decode step issues hundreds of small parallel ops and a condvar round trip per op costs
// more than the op.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace arbor {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads counts the caller; <= 0 means all cores
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Calls fn(thread_index, begin, end) on disjoint chunks covering [0, n); chunks are multiples of
  // `grain` (except the last). Returns when all chunks are done. Exceptions are rethrown here.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int, int64_t, int64_t)>& fn);
  // Runs fn(thread_index) once on each thread.
  void run_on_all(const std::function<void(int)>& fn);

  static int default_threads();  // physical cores available to this process

 private:
  void worker(int index);
  void dispatch(const std::function<void(int)>& task);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* task_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace arbor
