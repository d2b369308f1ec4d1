// bf16 GEMMs: C (+)= op(A) · op(B) with bf16 A and B, fp32 accumulation and an fp32 C, on the
// fastest kernel this processor runs correctly, chosen once per process.
//
// What: the matrix products of bf16 mixed precision (Megatron-LM's `--bf16`: bf16 weights and
//   activations, GEMMs accumulate in fp32), named like matmul.hpp's and with the same layout rules.
//   Two kernels compute them:
//   - Bf16GemmKernel::onednn: oneDNN's dnnl_gemm_bf16bf16f32 (VDPBF16PS, about twice sgemm's
//     rate), chosen when the processor has AVX512_BF16 and a probe product on it is exact. On
//     AVX2 processors oneDNN 2.6 refuses bf16 GEMM (dnnl_unimplemented); on AVX-512 processors
//     without BF16 it emulates the instruction, which gains nothing over sgemm, so neither uses it.
//   - Bf16GemmKernel::sgemm: the bf16 inputs widened to fp32 (exact) and OpenBLAS's sgemm.
// Guarantees: both kernels compute the same function up to summation order. A product of two bf16
//   values has at most 16 significant bits, so it is exact in fp32 (barring underflow below
//   2^-126); both kernels add the K exact products (and C when accumulating) in fp32, each addition
//   rounded to nearest, in their own orders. Hence for every element
//       |C_onednn - C_sgemm| <= 2 γ(K) · (Σ_k |a_k b_k| + |C_in|),  γ(n) = n·2^-24 / (1 - n·2^-24),
//   the standard bound on recursive summation error applied to each order. One exception:
//   VDPBF16PS treats subnormal inputs and outputs as zero (Intel SDM), so bf16 values below 2^-126
//   in magnitude may differ beyond it. The chosen kernel is named by describe_bf16_gemm() and
//   counted per thread (bf16_gemm_calls()), so a test or report can see which one actually ran.
//   oneDNN runs one thread per calling thread (its OpenMP team is pinned to 1, per thread), as the
//   reference's OpenBLAS does, so rank threads never fan out.
// Requirements: row-major, ld* the row stride in elements (>= the row length; < 0: dense);
//   C must not alias A or B; M, N, K >= 0. Thread-safe.
// Cost: 2·M·N·K flops; the sgemm kernel also widens op(A) and op(B) into per-thread fp32 scratch
//   (M·K + K·N floats). Every call opens a ComputeSpan "gemm_bf16" and adds to gemm_counters().
#pragma once

#include <cstdint>
#include <string>

#include "tspemu/core/bf16.hpp"

namespace tspemu::ref {

enum class Bf16GemmKernel : std::uint8_t { onednn, sgemm };
const char* bf16_gemm_kernel_name(Bf16GemmKernel k);  // "oneDNN" / "sgemm"

// The kernel every bf16 product of this process runs on (decided at the first call).
Bf16GemmKernel bf16_gemm_kernel();

// One line for reports and benchmark contexts, as describe_blas() for fp32, e.g.
//   "oneDNN 2.6.3 gemm_bf16bf16f32 (AVX512_BF16)"
//   "bf16 widened to fp32, OpenBLAS sgemm (no AVX512_BF16: oneDNN not used)"
std::string describe_bf16_gemm();

// The selection, a pure function of what was probed (tested directly): oneDNN when the processor
// has AVX512_BF16 and oneDNN's probe product ran and was exact; sgemm otherwise.
Bf16GemmKernel choose_bf16_gemm_kernel(bool cpu_has_avx512_bf16, bool onednn_probe_exact);

// C[M,N] = (accumulate ? C : 0) + A[M,K] · B[N,K]ᵀ     torch: C (+)= A @ B.T (Linear forward)
void matmul_nt(float* C, const bf16* A, const bf16* B, int M, int N, int K, bool accumulate = false,
               int lda = -1, int ldb = -1, int ldc = -1);
// C[M,N] = (accumulate ? C : 0) + A[M,K] · B[K,N]      torch: C (+)= A @ B   (input gradient)
void matmul_nn(float* C, const bf16* A, const bf16* B, int M, int N, int K, bool accumulate = false,
               int lda = -1, int ldb = -1, int ldc = -1);
// C[M,N] = (accumulate ? C : 0) + A[K,M]ᵀ · B[K,N]     torch: C (+)= A.T @ B (weight gradient)
void matmul_tn(float* C, const bf16* A, const bf16* B, int M, int N, int K, bool accumulate = false,
               int lda = -1, int ldb = -1, int ldc = -1);

// The same product on a named kernel (tests, benchmarks): row-major C = op(A)·op(B) (+ C), with
// ld* given explicitly. Returns false, leaving C unchanged, when the kernel cannot run here
// (oneDNN refused: no AVX-512).
bool bf16_gemm_on(Bf16GemmKernel kernel, bool transpose_a, bool transpose_b, int M, int N, int K,
                  const bf16* A, int lda, const bf16* B, int ldb, float* C, int ldc,
                  bool accumulate);

// Per-thread count of the bf16 products each kernel ran (not synchronised: the calling thread's).
struct Bf16GemmCalls {
  std::int64_t onednn = 0;
  std::int64_t sgemm = 0;
};
Bf16GemmCalls& bf16_gemm_calls();

// Pins oneDNN's OpenMP team to one thread for the calling thread (oneDNN sizes its team from the
// calling thread's omp_get_max_threads()). Called by the wrappers; exposed for code that calls
// oneDNN directly (the benchmark's dnnl_sgemm).
void ensure_onednn_single_threaded();

}  // namespace tspemu::ref
