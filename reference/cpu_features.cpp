#include "tspemu/reference/cpu_features.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tspemu::ref {

CpuFeatures cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12);
  if (!osxsave) return f;
  // The OS must save the wider registers (XCR0), or AVX instructions fault whatever cpuid says.
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool os_avx = (xcr0_lo & 0x6u) == 0x6u;       // XMM, YMM
  const bool os_avx512 = (xcr0_lo & 0xe6u) == 0xe6u;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512dq = b & (1u << 17),
             avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
  const unsigned max_subleaf = a;
  bool avx512bf16 = false;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    avx512bf16 = a & (1u << 5);
  }
  f.avx2_fma = os_avx && avx2 && fma;
  f.avx512 = os_avx512 && avx512f && avx512vl && avx512bw && avx512dq;
  f.avx512_bf16 = f.avx512 && avx512bf16;
#endif
  return f;
}

}  // namespace tspemu::ref
