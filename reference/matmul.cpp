#include "tspemu/reference/matmul.hpp"

#include <cblas.h>

#include <chrono>
#include <mutex>
#include <type_traits>

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

// One entry to BLAS for all three wrappers: row-major C = alpha*op(A)*op(B) + beta*C.
template <class T>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const T* A, int lda,
          const T* B, int ldb, T* C, int ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  ensure_blas_single_threaded();
  const auto start = std::chrono::steady_clock::now();
  const T beta = accumulate ? T(1) : T(0);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  } else {
    static_assert(std::is_same_v<T, double>);
    cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
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
