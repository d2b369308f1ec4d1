#include "tspemu/reference/matmul.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <type_traits>

#include "oracle_tasks.hpp"
#include "tspemu/core/compute_span.hpp"
#include "tspemu/core/dry_run.hpp"

namespace tspemu::ref {

void ensure_blas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

GemmCounters& gemm_counters() {
  thread_local GemmCounters counters;
  return counters;
}

namespace {

// Oracle GEMMs of at least this many multiply-adds run as row blocks of kOracleRows in parallel;
// smaller ones (attention's per-block products) as one call inside their attention task.
constexpr double kOracleMinFlops = 1 << 21;
constexpr int kOracleRows = 64;

// One entry to BLAS for all three wrappers: row-major C = alpha*op(A)*op(B) + beta*C.
template <class T>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const T* A, int lda,
          const T* B, int ldb, T* C, int ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  ensure_blas_single_threaded();
  ComputeSpan span("gemm", 2.0 * M * N * K);
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  const auto start = std::chrono::steady_clock::now();
  const T beta = accumulate ? T(1) : T(0);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  } else {
    static_assert(std::is_same_v<T, double>);
    // The oracle: rows of C in fixed blocks of kOracleRows, one dgemm each (oracle_tasks.hpp).
    // A block's rows are rows of op(A): for A^T they start at column m0 of A.
    const int blocks =
        M * static_cast<double>(N) * K >= kOracleMinFlops ? (M + kOracleRows - 1) / kOracleRows : 1;
    const int rows = blocks == 1 ? M : kOracleRows;
    detail::for_each_task<double>(blocks, [&](int i) {
      const int m0 = i * rows, m = std::min(rows, M - m0);
      const double* a = ta == CblasNoTrans ? A + static_cast<std::size_t>(m0) * lda : A + m0;
      cblas_dgemm(CblasRowMajor, ta, tb, m, N, K, 1.0, a, lda, B, ldb, beta,
                  C + static_cast<std::size_t>(m0) * ldc, ldc);
    });
  }
  const auto stop = std::chrono::steady_clock::now();
  GemmCounters& c = gemm_counters();
  c.calls += 1;
  c.nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(stop - start).count();
  c.flops += 2.0 * M * N * K;
}

}  // namespace

// With K == 0 BLAS still applies beta, so C is zeroed (or kept) as the contract says.
template <class T>
void matmul_nt(T* C, const T* A, const T* B, int M, int N, int K, bool accumulate, int lda, int ldb,
               int ldc) {
  gemm<T>(CblasNoTrans, CblasTrans, M, N, K, A, lda < 0 ? K : lda, B, ldb < 0 ? K : ldb, C,
          ldc < 0 ? N : ldc, accumulate);
}

template <class T>
void matmul_nn(T* C, const T* A, const T* B, int M, int N, int K, bool accumulate, int lda, int ldb,
               int ldc) {
  gemm<T>(CblasNoTrans, CblasNoTrans, M, N, K, A, lda < 0 ? K : lda, B, ldb < 0 ? N : ldb, C,
          ldc < 0 ? N : ldc, accumulate);
}

template <class T>
void matmul_tn(T* C, const T* A, const T* B, int M, int N, int K, bool accumulate, int lda, int ldb,
               int ldc) {
  gemm<T>(CblasTrans, CblasNoTrans, M, N, K, A, lda < 0 ? M : lda, B, ldb < 0 ? N : ldb, C,
          ldc < 0 ? N : ldc, accumulate);
}

#define TSPEMU_INSTANTIATE(T)                                                             \
  template void matmul_nt<T>(T*, const T*, const T*, int, int, int, bool, int, int, int); \
  template void matmul_nn<T>(T*, const T*, const T*, int, int, int, bool, int, int, int); \
  template void matmul_tn<T>(T*, const T*, const T*, int, int, int, bool, int, int, int);
TSPEMU_INSTANTIATE(float)
TSPEMU_INSTANTIATE(double)
#undef TSPEMU_INSTANTIATE

}  // namespace tspemu::ref
