// Run-time x86 feature detection (cpuid + xgetbv through the compiler's builtins).
#include "backend/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace arbor::cpu {

namespace {

std::string cpu_brand() {
#if defined(__x86_64__)
  unsigned regs[12] = {};
  unsigned max_ext = __get_cpuid_max(0x80000000u, nullptr);
  if (max_ext < 0x80000004u) return "";
  for (unsigned i = 0; i < 3; ++i) __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
  char buf[49] = {};
  std::memcpy(buf, regs, 48);
  std::string s(buf);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  size_t b = s.find_first_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b);
#else
  return "";
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__)
  // __builtin_cpu_supports also checks that the OS enables the register state (xgetbv), so a
  // kernel that hides AVX-512 from guests is handled.
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  unsigned a, b, c, d;
  if (f.avx2 && __get_cpuid(1, &a, &b, &c, &d)) f.avx2 = (c & (1u << 29)) != 0;  // F16C: cpuid.1:ecx bit 29
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  f.avx512_vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
  f.avx512_vbmi = f.avx512 && __builtin_cpu_supports("avx512vbmi");
  // AVX512_BF16 is cpuid.(7,1):eax bit 5; GCC 12's __builtin_cpu_supports knows it as "avx512bf16".
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  f.brand = cpu_brand();
  if (const char* cap = std::getenv("ARBOR_CPU_MAX_ISA")) {
    std::string_view v(cap);
    if (v == "scalar") {
      f.avx2 = f.avx512 = f.avx512_bf16 = f.avx512_vnni = f.avx512_vbmi = false;
    } else if (v == "avx2") {
      f.avx512 = f.avx512_bf16 = f.avx512_vnni = f.avx512_vbmi = false;
    } else if (v == "avx512") {
      f.avx512_bf16 = f.avx512_vnni = f.avx512_vbmi = false;
    } else if (!v.empty() && v != "native") {
      fail("cpu: ARBOR_CPU_MAX_ISA='{}' is not one of scalar, avx2, avx512, native", v);
    }
  }
  return f;
}

}  // namespace

std::string CpuFeatures::summary() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(avx512, "avx512");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_vnni, "avx512_vnni");
  add(avx512_vbmi, "avx512_vbmi");
  return s.empty() ? "scalar" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace arbor::cpu
