// The trellis kernels (linear_trellis_impl.h) on AVX-512 (F + BW): 16 weights decoded per step.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/linear_trellis.h"
#include "core/error.h"

// GCC 12 flags the self-initialised "undefined" operand inside its AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define TT __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")))
#define TTI TT inline __attribute__((always_inline))

namespace arbor::cpu::trellis_detail::avx512 {

namespace {

struct V {
  using F = __m512;
  static constexpr int W = 16;
  static constexpr int MR1 = 4, NR1 = 4;  // axis 1 tile: 16 accumulators
  static constexpr int MR0 = 6, NV0 = 4;  // axis 0 tile: 24 accumulators over 64 outputs
  TTI static F zero() { return _mm512_setzero_ps(); }
  TTI static F loadu(const float* p) { return _mm512_loadu_ps(p); }
  TTI static void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  TTI static F set1(float x) { return _mm512_set1_ps(x); }
  TTI static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  TTI static F add(F a, F b) { return _mm512_add_ps(a, b); }
  TTI static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  TTI static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  template <int K>
  TTI static F decode(const uint32_t* ext, int t0);
  // The block's words followed by its first two again: a window that runs past the block's end wraps to
  // its start (tail-biting), and the 4-byte reads of decode never leave the buffer.
  template <int K>
  struct Block {
    static constexpr int kWords = 256 * K / 32;
    alignas(64) uint32_t ext[kWords + 2];
    TTI explicit Block(const uint32_t* block) {
      std::memcpy(ext, block, kWords * 4);
      ext[kWords] = block[0], ext[kWords + 1] = block[1];
    }
    template <int C>
    TTI F decode() const { return V::decode<K>(ext, C * W); }
  };
};

// The state of weight t starts at bit (255 - t)*k; decode reads W consecutive weights as W/4 groups
// of four, group g (weights t0+4g .. t0+4g+3) from the 32-bit word at byte ((252 - t0 - 4g)*k) / 8, lane
// i of the group shifted right by ((252 - 4g)*k mod 8) + (3 - i)*k (at most 4 + 9 + 12 = 25 bits: the
// 12-bit window fits). t0 a multiple of 8 keeps those shifts the same for every t0.
template <int K>
TTI int group_word_(const uint32_t* ext, int t0, int g) {
  int v;
  std::memcpy(&v, reinterpret_cast<const uint8_t*>(ext) + (((252 - t0 - 4 * g) * K) >> 3), 4);
  return v;
}

template <int K>
constexpr int lane_shift_(int j) {
  return ((252 - 4 * (j / 4)) * K) % 8 + (3 - j % 4) * K;
}

template <int K>
TTI __m512i shifts_() {
  alignas(64) static constexpr int kShift[16] = {lane_shift_<K>(0),  lane_shift_<K>(1),  lane_shift_<K>(2),  lane_shift_<K>(3),
                                                 lane_shift_<K>(4),  lane_shift_<K>(5),  lane_shift_<K>(6),  lane_shift_<K>(7),
                                                 lane_shift_<K>(8),  lane_shift_<K>(9),  lane_shift_<K>(10), lane_shift_<K>(11),
                                                 lane_shift_<K>(12), lane_shift_<K>(13), lane_shift_<K>(14), lane_shift_<K>(15)};
  return _mm512_load_si512(kShift);
}

template <int K>
TTI V::F V::decode(const uint32_t* ext, int t0) {
  __m128i g = _mm_cvtsi32_si128(group_word_<K>(ext, t0, 0));
  g = _mm_insert_epi32(g, group_word_<K>(ext, t0, 1), 1);
  g = _mm_insert_epi32(g, group_word_<K>(ext, t0, 2), 2);
  g = _mm_insert_epi32(g, group_word_<K>(ext, t0, 3), 3);
  const __m512i v = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_castsi128_si512(g));
  const __m512i state =
      _mm512_and_si512(_mm512_srlv_epi32(v, shifts_<K>()), _mm512_set1_epi32(0xfff));
  const __m512i x = _mm512_add_epi32(_mm512_mullo_epi32(state, _mm512_set1_epi32(34038481)), _mm512_set1_epi32(76625530));
  const __m512i pairs = _mm512_maddubs_epi16(x, _mm512_set1_epi8(1));
  const __m512i sum = _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(sum, _mm512_set1_epi32(510)));
}

#include "backend/cpu/linear_trellis_impl.h"

}  // namespace

void gemv(ThreadPool& pool, const Args& a) { gemv_impl(pool, a); }
void tiled(ThreadPool& pool, const Args& a) { tiled_impl(pool, a); }

}  // namespace arbor::cpu::trellis_detail::avx512
