// Matrix products for the reference: thin wrappers over one-threaded OpenBLAS GEMM.
//
// What: C (+)= op(A) · op(B) for row-major float/double matrices, named after the PyTorch
//   expression they implement. All other reference arithmetic is plain loops.
// Requirements: row-major storage; ld* is the row stride in elements (>= the row length), so
//   a head's columns inside a [T, NH*hs] activation can be addressed without copying.
//   C must not alias A or B. Thread-safe: concurrent calls from rank threads are fine.
// Guarantees: OpenBLAS is pinned to one thread (openblas_set_num_threads(1), once per process)
//   before the first product, so a rank thread never fans out; results of one call are
//   deterministic for fixed shapes and strides. Every call adds its wall time and flop count to
//   the calling thread's gemm_counters() (used by the benchmark for the GEMM share) and opens a
//   ComputeSpan "gemm" with its FLOPs (core/compute_span.hpp), so a rank's trace and simulated
//   clock see it.
// Cost: 2*M*N*K flops.
#pragma once

#include <cstdint>

namespace tspemu::ref {

// ld* < 0 (the default) means densely packed rows.

// C[M,N] = (accumulate ? C : 0) + A[M,K] · B[N,K]ᵀ
//   torch: C (+)= A @ B.T      (Linear forward: y = x Wᵀ)
template <class T>
void matmul_nt(T* C, const T* A, const T* B, int M, int N, int K, bool accumulate = false,
               int lda = -1, int ldb = -1, int ldc = -1);

// C[M,N] = (accumulate ? C : 0) + A[M,K] · B[K,N]
//   torch: C (+)= A @ B        (input gradient: dx = dy W)
template <class T>
void matmul_nn(T* C, const T* A, const T* B, int M, int N, int K, bool accumulate = false,
               int lda = -1, int ldb = -1, int ldc = -1);

// C[M,N] = (accumulate ? C : 0) + A[K,M]ᵀ · B[K,N]
//   torch: C (+)= A.T @ B      (weight gradient: dW = dyᵀ x)
template <class T>
void matmul_tn(T* C, const T* A, const T* B, int M, int N, int K, bool accumulate = false,
               int lda = -1, int ldb = -1, int ldc = -1);

// Per-thread GEMM instrumentation. Not synchronised: each thread reads only its own counters.
struct GemmCounters {
  std::int64_t calls = 0;
  std::int64_t nanoseconds = 0;  // wall time spent inside BLAS calls
  double flops = 0;              // 2*M*N*K summed
};
GemmCounters& gemm_counters();  // the calling thread's counters; reset by assigning {}

// Pins OpenBLAS to one thread. Called automatically by the wrappers; exposed for code that calls
// cblas directly.
void ensure_blas_single_threaded();

}  // namespace tspemu::ref
