// measure_read_bandwidth: threads sum a buffer much larger than the caches with wide integer loads
// (four independent accumulators, so the loop is bound by memory, not by add latency).
#include "backend/cpu/bandwidth.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "backend/cpu/cpu_features.h"
#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace arbor::cpu {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kBlock = size_t(1) << 16;  // 64 KiB: the unit of the thread split

// Each sums [p, p + n) as 64-bit integers; n is a multiple of 256 bytes.
uint64_t sum_scalar(const uint8_t* p, size_t n) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i < n / 8; i += 4) s0 += q[i], s1 += q[i + 1], s2 += q[i + 2], s3 += q[i + 3];
  return s0 + s1 + s2 + s3;
}

#if defined(__x86_64__)
// The same software prefetch distance as the GEMV kernels (linear_avx512.cpp), so the yardstick reads
// memory the best way the kernels know; without it a single stream was up to ~30% slower here.
constexpr size_t kPrefetchBytes = 4096;

__attribute__((target("avx2"))) uint64_t sum_avx2(const uint8_t* p, size_t n) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 128) {
    _mm_prefetch(reinterpret_cast<const char*>(p) + i + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p) + i + kPrefetchBytes + 64, _MM_HINT_T0);
    s0 = _mm256_add_epi64(s0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
  return out[0] + out[1] + out[2] + out[3];
}

__attribute__((target("avx512f"))) uint64_t sum_avx512(const uint8_t* p, size_t n) {
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 256) {
#pragma GCC unroll 4
    for (size_t b = 0; b < 256; b += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + i + kPrefetchBytes + b, _MM_HINT_T0);
    s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i));
    s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 64));
    s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 128));
    s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 192));
  }
  alignas(64) uint64_t out[8];
  _mm512_store_si512(out, _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
  uint64_t s = 0;
  for (uint64_t v : out) s += v;
  return s;
}
#endif

using SumFn = uint64_t (*)(const uint8_t*, size_t);

SumFn pick_sum() {
#if defined(__x86_64__)
  if (cpu_features().avx512) return sum_avx512;
  if (cpu_features().avx2) return sum_avx2;
#endif
  return sum_scalar;
}

}  // namespace

HugePageBuffer::HugePageBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  map_size_ = (bytes + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
  map_ = mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("HugePageBuffer: mmap of {} bytes failed: {}", map_size_, std::strerror(errno));
  }
  auto a = (reinterpret_cast<uintptr_t>(map_) + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  ptr_ = reinterpret_cast<void*>(a);
  // Advisory: without THP the buffer still works, only with more TLB misses.
  madvise(ptr_, map_size_ - (a - reinterpret_cast<uintptr_t>(map_)), MADV_HUGEPAGE);
}

HugePageBuffer::~HugePageBuffer() {
  if (map_) munmap(map_, map_size_);
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& o) noexcept
    : ptr_(o.ptr_), map_(o.map_), size_(o.size_), map_size_(o.map_size_) {
  o.ptr_ = o.map_ = nullptr;
  o.size_ = o.map_size_ = 0;
}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, map_size_);
    ptr_ = o.ptr_, map_ = o.map_, size_ = o.size_, map_size_ = o.map_size_;
    o.ptr_ = o.map_ = nullptr;
    o.size_ = o.map_size_ = 0;
  }
  return *this;
}

static size_t checked_size(size_t bytes) {
  ARBOR_CHECK(bytes >= (size_t(1) << 20), "bandwidth: buffer of {} bytes is too small (need >= 1 MiB, >> L3)", bytes);
  return bytes / kBlock * kBlock;
}

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, size_t bytes) : pool_(pool), buf_(checked_size(bytes)) {
  const int64_t blocks = int64_t(buf_.size() / kBlock);
  uint8_t* p = buf_.as<uint8_t>();
  // Fill with non-zero bytes from the reading threads (first touch places pages near them).
  pool.parallel_for(blocks, 1, [&](int, int64_t b0, int64_t b1) {
    std::memset(p + size_t(b0) * kBlock, 0x5a, size_t(b1 - b0) * kBlock);
  });
}

double ReadBandwidthProbe::pass() {
  static const SumFn sum = pick_sum();
  const uint8_t* p = buf_.as<uint8_t>();
  const int64_t blocks = int64_t(buf_.size() / kBlock);
  std::atomic<uint64_t> sink{0};
  const auto t0 = std::chrono::steady_clock::now();
  pool_.parallel_for(blocks, 1, [&](int, int64_t b0, int64_t b1) {
    sink.fetch_add(sum(p + size_t(b0) * kBlock, size_t(b1 - b0) * kBlock), std::memory_order_relaxed);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The sum is known (every byte 0x5a); checking it keeps the loads from being optimized away.
  ARBOR_CHECK(sink.load() == uint64_t(blocks) * (kBlock / 8) * 0x5a5a5a5a5a5a5a5aull,
              "bandwidth: checksum mismatch after a pass over {} bytes", buf_.size());
  const double bw = s > 0 ? double(buf_.size()) / s : 0;
  best_ = std::max(best_, bw);
  return bw;
}

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  ARBOR_CHECK(reps >= 1, "bandwidth: reps must be >= 1, got {}", reps);
  ReadBandwidthProbe probe(pool, bytes);
  for (int r = 0; r < reps; ++r) probe.pass();
  return probe.best();
}

}  // namespace arbor::cpu
