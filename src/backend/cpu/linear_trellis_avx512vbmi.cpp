// The trellis kernels (linear_trellis_impl.h) on AVX-512 with VBMI and VNNI (Ice Lake, Zen 4 and later):
// 16 weights decoded per step, reading the block's words in place (no copy).
//
// Lane i of chunk C is weight t = 16C + i of the block; its 12-bit window starts at bit (255 - t)·k =
// (240 - 16C)·k + (15 - i)·k, i.e. at bit (15 - i)·k of the bytes from base(C) = (15 - C)·2k.
//   k = 2, 3: every window of the chunk ends by bit 15·3 + 12 = 57, so one 64-bit word from base(C),
//     broadcast to all eight 64-bit lanes, holds them all; vpmultishiftqb gives dword lane i the 16 bits
//     from bit (15 - i)·k (bytes 0 and 1 of the lane; bytes 2 and 3 are junk) and an AND keeps 12.
//   k = 4: the chunk spans 72 bits; a 16-byte load and vpermb give dword lane i the 4 bytes from byte
//     (15 - i)/2, a variable shift by 4·((15 - i) & 1) and an AND leave the state.
// Chunk 0's bytes run past the block's end; its word (k = 4: its 16 bytes) is built once per block from
// the block's last bytes followed by its first ones (tail-biting).
// The 1MAD: vpmulld + vpaddd, then one vpdpbusd against bytes of 1 sums the four bytes onto -510.
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

#define TT __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vnni")))
#define TTI TT inline __attribute__((always_inline))

namespace arbor::cpu::trellis_detail::avx512vbmi {

namespace {

template <int K>
struct Controls {
  // k <= 3, vpmultishiftqb: dword lane i, byte j reads 8 bits from bit (15 - i)·k + 8j of its 64-bit lane.
  alignas(64) uint8_t multishift[64] = {};
  // k = 4, vpermb: dword lane i, byte j is byte (15 - i)/2 + j of the 16; then shifted right by shift[i].
  alignas(64) uint8_t perm[64] = {};
  alignas(64) uint32_t shift[16] = {};
  constexpr Controls() {
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 4; ++j) {
        multishift[4 * i + j] = uint8_t(((15 - i) * K + 8 * j) & 63);
        perm[4 * i + j] = uint8_t((15 - i) / 2 + j);
      }
      shift[i] = uint32_t(4 * ((15 - i) & 1));
    }
  }
};
template <int K>
inline constexpr Controls<K> kControls{};

TTI __m512 value_(__m512i state) {
  const __m512i x = _mm512_add_epi32(_mm512_mullo_epi32(state, _mm512_set1_epi32(34038481)), _mm512_set1_epi32(76625530));
  return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_set1_epi32(-510), x, _mm512_set1_epi8(1)));
}

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
  struct Block {
    static_assert(K >= 2 && K <= 3);
    const uint8_t* p;
    uint64_t wrap;  // chunk 0's 8 bytes: the block's last 2k bytes, then its first 8 - 2k
    TTI explicit Block(const uint32_t* block) : p(reinterpret_cast<const uint8_t*>(block)) {
      uint64_t tail, head;
      std::memcpy(&tail, p + 32 * K - 8, 8);
      std::memcpy(&head, p, 8);
      wrap = (tail >> (64 - 16 * K)) | (head << (16 * K));
    }
    template <int C>
    TTI F decode() const {
      uint64_t q = wrap;
      if constexpr (C != 0) std::memcpy(&q, p + (15 - C) * 2 * K, 8);
      const __m512i ctl = _mm512_load_si512(kControls<K>.multishift);
      const __m512i st = _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, _mm512_set1_epi64(int64_t(q))), _mm512_set1_epi32(0xfff));
      return value_(st);
    }
  };
};

template <>
struct V::Block<4> {
  const uint8_t* p;
  __m128i wrap;  // chunk 0's 16 bytes: the block's last 8 bytes, then its first 8
  TTI explicit Block(const uint32_t* block) : p(reinterpret_cast<const uint8_t*>(block)) {
    wrap = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 120)), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  template <int C>
  TTI F decode() const {
    __m128i b = wrap;
    if constexpr (C != 0) b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (15 - C) * 8));
    const __m512i v = _mm512_permutexvar_epi8(_mm512_load_si512(kControls<4>.perm), _mm512_castsi128_si512(b));
    const __m512i st = _mm512_and_si512(_mm512_srlv_epi32(v, _mm512_load_si512(kControls<4>.shift)), _mm512_set1_epi32(0xfff));
    return value_(st);
  }
};

#include "backend/cpu/linear_trellis_impl.h"

}  // namespace

void gemv(ThreadPool& pool, const Args& a) { gemv_impl(pool, a); }
void tiled(ThreadPool& pool, const Args& a) { tiled_impl(pool, a); }

}  // namespace arbor::cpu::trellis_detail::avx512vbmi
