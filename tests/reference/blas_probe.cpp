// Helper for blas_kernel_test: selects the BLAS kernel as a program's main() would, then prints
//   line 1: describe_blas()
//   line 2: the core in use
//   then M*N lines "c oracle": C[M, N] = A[M, K] · B[N, K]ᵀ by cblas_sgemm (fp32, %a) and by a
//   double-accumulated loop (%a), on fixed pseudo-random inputs in [-1, 1).
#include <cblas.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "tspemu/reference/blas_kernel.hpp"

int main(int argc, char** argv) {
  tspemu::ref::select_best_blas_kernel(argc, argv);
  openblas_set_num_threads(1);
  constexpr int M = 48, N = 40, K = 256;
  std::uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  };
  std::vector<float> A(M * K), B(N * K), C(M * N);
  for (float& a : A) a = next();
  for (float& b : B) b = next();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A.data(), K, B.data(), K,
              0.0f, C.data(), N);
  std::printf("%s\n%s\n", tspemu::ref::describe_blas().c_str(),
              tspemu::ref::blas_kernel().core.c_str());
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double exact = 0;
      for (int k = 0; k < K; ++k) exact += double(A[m * K + k]) * double(B[n * K + k]);
      std::printf("%a %a\n", double(C[m * N + n]), exact);
    }
  return 0;
}
