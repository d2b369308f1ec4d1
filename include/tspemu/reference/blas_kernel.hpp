// BLAS kernel selection: which OpenBLAS core runs the reference's GEMMs, and picking a better one.
//
// What: a DYNAMIC_ARCH OpenBLAS chooses its kernels ("core") once, when the library initialises,
//   from the CPU it recognises. A release older than the processor (Debian 12's 0.3.21 on a recent
//   Xeon) falls back to `Prescott` (SSE3) kernels, several times slower than the AVX-512 ones the
//   processor runs (docs/benchmarks.md). This header says what runs (blas_kernel, describe_blas)
//   and lets a program's main() switch to the best core the processor supports
//   (select_best_blas_kernel).
// Why re-execute: OpenBLAS reads OPENBLAS_CORETYPE in its load-time constructor, before main();
//   setting it later changes nothing. The selector therefore sets it and execv()s
//   /proc/self/exe with the same argv, once; a launcher script would need to exist for every
//   program (tspemu, benchmarks, users' own mains) and would not see the core OpenBLAS detected.
// Environment (all optional):
//   OPENBLAS_CORETYPE      the user's choice; kept as is (never replaced) unless TSPEMU_BLAS_AUTO
//                          is "force".
//   TSPEMU_BLAS_AUTO       "0": never select; "force": select even over OPENBLAS_CORETYPE (its
//                          core then counts as the detected one); anything else: select when the
//                          detected core is a fallback and OPENBLAS_CORETYPE is unset.
//   TSPEMU_BLAS_DETECTED   set by the selector before re-executing: the core OpenBLAS had chosen.
//                          Its presence marks "already selected" and prevents a second selection.
//   TSPEMU_BLAS_REJECTED   set by the selector when the selected core failed the GEMM check and
//                          the process went back to the detected core; nothing is tried again.
// Guarantees: the selector re-executes at most twice per start (select, then revert only if the
//   GEMM check fails); a process whose environment the user set keeps its kernel. Core names are
//   OpenBLAS's (openblas_get_corename()); comparisons ignore case. Off x86-64, no core is "best"
//   and nothing is selected.
// Cost: blas_kernel()/describe_blas(): a few string operations. The GEMM check: one 64x64x64 and
//   one 37x29x43 sgemm against a naive loop, well under a millisecond.
#pragma once

#include <string>
#include <string_view>

namespace tspemu::ref {

// What the linked BLAS is and which kernels it runs.
struct BlasKernel {
  std::string library;  // "OpenBLAS 0.3.21" (the first two words of config)
  std::string config;   // openblas_get_config(): "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
  std::string core;     // openblas_get_corename(): "Prescott", "Cooperlake", ...
};
BlasKernel blas_kernel();

// The fastest OpenBLAS 0.3.21 core this processor (and its OS, via XCR0) supports, from cpuid:
// avx512bf16 -> "Cooperlake"; avx512f+vl+bw+dq -> "SkylakeX"; avx2+fma -> "Haswell"; else "".
std::string best_supported_core();

// True when `core` is far below `best`: a pre-AVX2 core (Prescott, Core2, Nehalem, Sandybridge
// class, old AMD) while the processor supports at least Haswell. A Haswell/Zen (AVX2+FMA) core on
// an AVX-512 processor is not a fallback: its sgemm runs about as fast as the AVX-512 core's, and
// far faster than Prescott's (docs/benchmarks.md). Unknown names: false.
bool is_fallback(std::string_view core, std::string_view best);
bool is_fallback();  // the core in use against best_supported_core()

// One line for reports and benchmark contexts, e.g.
//   "OpenBLAS 0.3.21 Cooperlake (selected; detected Prescott)"
//   "OpenBLAS 0.3.21 Prescott (fallback: processor supports Cooperlake; set
//    OPENBLAS_CORETYPE=Cooperlake)"
//   "OpenBLAS 0.3.21 Cooperlake (detected)"
std::string describe_blas();

// True when `core`'s sgemm matches a naive double-accumulated loop exactly on inputs whose
// products and sums are exact in fp32 (multiples of 1/16 in [-1, 1]), so any correct kernel,
// whatever its summation order or FMA use, gives bitwise the exact result.
bool blas_gemm_check();

// The start-up decision, a pure function of the environment and the cores (tested directly).
enum class BlasAction {
  keep,    // run on as is
  select,  // re-execute with OPENBLAS_CORETYPE = best, TSPEMU_BLAS_DETECTED = core in use
  verify,  // this process is a selection: run the GEMM check, re-execute with the detected core
           // (TSPEMU_BLAS_REJECTED = core in use) if it fails
};
struct BlasEnvironment {
  std::string coretype;  // OPENBLAS_CORETYPE ("" when unset)
  std::string autosel;   // TSPEMU_BLAS_AUTO
  std::string detected;  // TSPEMU_BLAS_DETECTED
  std::string rejected;  // TSPEMU_BLAS_REJECTED
};
BlasEnvironment blas_environment();
BlasAction decide_blas_action(const BlasEnvironment& env, std::string_view core_in_use,
                              std::string_view best);

// Call first thing in main(), before any thread starts. Acts on decide_blas_action(): may execv()
// /proc/self/exe with argv (argv[argc] must be nullptr, as main() receives it), flushing stdio
// first; returns only when no re-execution happens (or execv itself failed, which is reported on
// stderr and leaves the kernel as it was). Returns true when the running core is one this
// function selected and the GEMM check passed.
bool select_best_blas_kernel(int argc, char** argv);

}  // namespace tspemu::ref
