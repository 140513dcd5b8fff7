// Memory read bandwidth, measured: the yardstick for memory-bound kernels (decode GEMV streams every
// weight byte once per token, so its speed is quoted as a fraction of this). Also the anonymous
// huge-page buffer both the measurement and the kernel benchmarks read from.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"

namespace arbor::cpu {

// Read bandwidth in bytes/s: the threads of `pool` each sum a contiguous share of a `bytes`-long buffer
// (should be >> L3; default 1 GiB) with the widest loads the CPU has; the best of `reps` passes.
// Throws arbor::Error if bytes < 1 MiB or reps < 1.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t(1) << 30, int reps = 5);

// Anonymous memory, 2 MiB-aligned, with transparent huge pages requested (madvise), so a sequential
// reader is not limited by 4 KiB TLB misses. Contents start zeroed. Owning; frees with munmap.
class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  explicit HugePageBuffer(size_t bytes);  // throws arbor::Error naming the size on failure
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& o) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& o) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;   // 2 MiB-aligned start inside the mapping
  void* map_ = nullptr;   // the mapping itself (over-allocated by 2 MiB for the alignment)
  size_t size_ = 0;
  size_t map_size_ = 0;
};

// measure_read_bandwidth's measurement kept ready for repeated passes, so a benchmark on a shared
// machine can interleave bandwidth passes with the kernel it rates (both then see the same load).
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(ThreadPool& pool, size_t bytes = size_t(1) << 30);  // allocates and fills
  double pass();  // one timed pass over the buffer; returns its bytes/s and updates best()
  double best() const { return best_; }

 private:
  ThreadPool& pool_;
  HugePageBuffer buf_;
  double best_ = 0;
};

}  // namespace arbor::cpu
