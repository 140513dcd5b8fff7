// CpuFeatures: which x86 SIMD extensions this CPU and OS support, detected once at run time, so the
// CPU kernels can pick an ISA-specific variant without global -m flags.
#pragma once
#include <string>

namespace arbor::cpu {

struct CpuFeatures {
  bool avx2 = false;        // AVX2 + FMA + F16C (the "avx2" kernel level needs all three)
  bool avx512 = false;      // AVX-512 F + BW + VL + DQ, with the OS saving zmm state
  bool avx512_bf16 = false; // AVX-512 BF16 (vdpbf16ps) on top of avx512
  bool avx512_vnni = false; // AVX-512 VNNI (int8 dot products; for quantized kernels)
  bool avx512_vbmi = false; // AVX-512 VBMI (vpermb, vpmultishiftqb: byte permutes, unaligned bit fields)
  std::string brand;        // "AMD EPYC 9B45 ...", from cpuid leaves 0x80000002..4
  std::string summary() const;  // "avx2 avx512 avx512_bf16 avx512_vnni avx512_vbmi"
};

// Detected on first call (thread-safe); the environment variable ARBOR_CPU_MAX_ISA=scalar|avx2|avx512
// caps what is reported, to exercise the fallbacks on a machine that has more.
const CpuFeatures& cpu_features();

}  // namespace arbor::cpu
