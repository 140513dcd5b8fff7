// Integer hashing shared by the host code: splitmix64's finalizer (a bijection that spreads every input
// bit over the output), used for hash tables, chained block hashes and counter-based random numbers.
#pragma once
#include <cstdint>

namespace arbor {

constexpr uint64_t splitmix64_mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace arbor
