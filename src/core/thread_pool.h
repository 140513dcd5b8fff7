// ThreadPool: a fixed set of workers that split index ranges; the caller's thread takes part.
// Dispatch is a generation counter that workers spin on briefly, then sleep on (atomic wait),
// because a decode step issues hundreds of small parallel ops and a condvar round trip per op costs
// more than the op. Chunks are handed out through an atomic claim counter tagged with the job's
// generation, and the caller waits for chunks, not for threads: on a busy machine a descheduled
// worker would otherwise stall every op for a scheduler slice (seen: 12-24 ms); now the threads that
// are running take its chunk, and a late worker finds nothing left and goes back to sleep.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
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
  // Calls fn(thread_index, begin, end) on disjoint chunks covering [0, n): about one chunk per
  // thread, each a multiple of `grain` (except the last). Returns when all chunks are done; the first
  // exception thrown by fn is rethrown here. Not reentrant: one job at a time per pool.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int, int64_t, int64_t)>& fn);
  // Calls fn(i) for every i in [0, size()), spread over the threads.
  void run_on_all(const std::function<void(int)>& fn);

  static int default_threads();  // cores available to this process

 private:
  void worker(int index);
  void claim_chunks(int thread_index);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> generation_{0};  // bumped to wake workers
  std::atomic<bool> stop_{false};
  // The current job. Workers read these only after claiming a chunk of the job's generation, when the
  // caller is still waiting for that chunk, so they are stable and `fn` is alive.
  std::atomic<uint64_t> claim_{0};  // (job generation << 40) | (chunks << 20) | next chunk
  std::atomic<int64_t> chunks_done_{0};
  const std::function<void(int, int64_t, int64_t)>* job_fn_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1, job_grains_ = 0;
  std::mutex err_mutex_;
  std::exception_ptr job_err_;
};

}  // namespace arbor
