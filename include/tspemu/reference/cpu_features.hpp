// CpuFeatures: which vector instruction sets this processor and its OS support, from cpuid.
//
// What: the features the run-time kernel choices depend on (the OpenBLAS core in blas_kernel.hpp,
//   the bf16 GEMM kernel in bf16_gemm.hpp), probed once in one place.
// Guarantees: a feature is reported only when the processor has it (cpuid) and the OS saves the
//   registers it uses (XCR0: YMM for AVX2, opmask and ZMM for AVX-512), since the instructions
//   fault otherwise whatever cpuid says. Off x86-64 every field is false.
// Cost: a few cpuid instructions and one xgetbv per call.
#pragma once

namespace tspemu::ref {

struct CpuFeatures {
  bool avx2_fma = false;  // AVX2 and FMA3 (OpenBLAS's Haswell/Zen cores)
  bool avx512 = false;    // AVX512 F, VL, BW and DQ (OpenBLAS's SkylakeX core)
  bool avx512_bf16 =
      false;  // avx512 and AVX512_BF16 (VDPBF16PS: Cooper Lake, Sapphire Rapids, Zen 4)
};
CpuFeatures cpu_features();

}  // namespace tspemu::ref
