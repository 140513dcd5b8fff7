// The trellis kernels (linear_trellis_impl.h) on AVX2 + FMA: 8 weights decoded per step.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/linear_trellis.h"
#include "core/error.h"

#define TT __attribute__((target("avx2,fma")))
#define TTI TT inline __attribute__((always_inline))

namespace arbor::cpu::trellis_detail::avx2 {

namespace {

struct V {
  using F = __m256;
  static constexpr int W = 8;
  static constexpr int MR1 = 4, NR1 = 3;  // axis 1 tile: 12 accumulators, 3 weight rows, 1 x vector
  static constexpr int MR0 = 6, NV0 = 2;  // axis 0 tile: 12 accumulators over 16 outputs
  TTI static F zero() { return _mm256_setzero_ps(); }
  TTI static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  TTI static void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  TTI static F set1(float x) { return _mm256_set1_ps(x); }
  TTI static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  TTI static F add(F a, F b) { return _mm256_add_ps(a, b); }
  TTI static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  TTI static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
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
TTI uint32_t group_word_(const uint32_t* ext, int t0, int g) {
  uint32_t v;
  std::memcpy(&v, reinterpret_cast<const uint8_t*>(ext) + (((252 - t0 - 4 * g) * K) >> 3), 4);
  return v;
}

template <int K>
constexpr int lane_shift_(int j) {
  return ((252 - 4 * (j / 4)) * K) % 8 + (3 - j % 4) * K;
}

template <int K>
TTI V::F V::decode(const uint32_t* ext, int t0) {
  const __m128i g = _mm_insert_epi32(_mm_cvtsi32_si128(int(group_word_<K>(ext, t0, 0))), int(group_word_<K>(ext, t0, 1)), 1);
  const __m256i v = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(g), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  const __m256i sh = _mm256_setr_epi32(lane_shift_<K>(0), lane_shift_<K>(1), lane_shift_<K>(2), lane_shift_<K>(3), lane_shift_<K>(4),
                                       lane_shift_<K>(5), lane_shift_<K>(6), lane_shift_<K>(7));
  const __m256i state = _mm256_and_si256(_mm256_srlv_epi32(v, sh), _mm256_set1_epi32(0xfff));
  const __m256i x = _mm256_add_epi32(_mm256_mullo_epi32(state, _mm256_set1_epi32(34038481)), _mm256_set1_epi32(76625530));
  const __m256i pairs = _mm256_maddubs_epi16(x, _mm256_set1_epi8(1));  // byte pairs summed (unsigned x signed 1)
  const __m256i sum = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  return _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, _mm256_set1_epi32(510)));
}

#include "backend/cpu/linear_trellis_impl.h"

}  // namespace

void gemv(ThreadPool& pool, const Args& a) { gemv_impl(pool, a); }
void tiled(ThreadPool& pool, const Args& a) { tiled_impl(pool, a); }

}  // namespace arbor::cpu::trellis_detail::avx2
