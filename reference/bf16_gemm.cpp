#include "tspemu/reference/bf16_gemm.hpp"

#include <cblas.h>
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/core/compute_span.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/blas_kernel.hpp"
#include "tspemu/reference/cpu_features.hpp"
#include "tspemu/reference/matmul.hpp"

// oneDNN defines this row-major bf16 GEMM `extern "C" DNNL_API` in src/common/gemm.cpp and
// exports it from libdnnl.so.2, but leaves it out of the public header (its own tests declare it
// the same way). bfloat16_t there is a struct of one uint16_t: bf16's layout.
extern "C" dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N,
                                               dnnl_dim_t K, float alpha, const tspemu::bf16* A,
                                               dnnl_dim_t lda, const tspemu::bf16* B,
                                               dnnl_dim_t ldb, float beta, float* C,
                                               dnnl_dim_t ldc);

namespace tspemu::ref {
namespace {

// oneDNN built with the OpenMP runtime (Debian's: libgomp) sizes its team from the calling
// thread's omp_get_max_threads(), a per-thread setting. It is set through the libgomp oneDNN
// loaded (looked up, not linked, so a program that never runs oneDNN needs no OpenMP).
bool pin_onednn_threads() {
  const dnnl_version_t* v = dnnl_version();
  if (v->cpu_runtime == DNNL_RUNTIME_SEQ) return true;
  if (v->cpu_runtime != DNNL_RUNTIME_OMP) return false;
  using SetNumThreads = void (*)(int);
  static const auto set_num_threads = []() -> SetNumThreads {
    void* gomp = ::dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
    return gomp ? reinterpret_cast<SetNumThreads>(::dlsym(gomp, "omp_set_num_threads")) : nullptr;
  }();
  if (set_num_threads == nullptr) return false;
  set_num_threads(1);
  return true;
}

// Dense fp32 copy of a rows x cols bf16 matrix with row stride ld (exact).
void widen(std::vector<float>& out, const bf16* in, int rows, int cols, int ld) {
  out.resize(static_cast<std::size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const bf16* src = in + static_cast<std::size_t>(r) * ld;
    float* dst = out.data() + static_cast<std::size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) dst[c] = src[c].to_float();
  }
}

void sgemm_widened(bool ta, bool tb, int M, int N, int K, const bf16* A, int lda, const bf16* B,
                   int ldb, float* C, int ldc, bool accumulate) {
  thread_local std::vector<float> a, b;
  // Stored shapes: A is [M,K] (or [K,M] transposed), B is [K,N] (or [N,K]).
  widen(a, A, ta ? K : M, ta ? M : K, lda);
  widen(b, B, tb ? N : K, tb ? K : N, ldb);
  ensure_blas_single_threaded();
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, 1.0f, a.data(), ta ? M : K, b.data(), tb ? K : N, accumulate ? 1.0f : 0.0f, C,
              ldc);
}

bool onednn_gemm(bool ta, bool tb, int M, int N, int K, const bf16* A, int lda, const bf16* B,
                 int ldb, float* C, int ldc, bool accumulate) {
  ensure_onednn_single_threaded();
  return dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb,
                               accumulate ? 1.0f : 0.0f, C, ldc) == dnnl_success;
}

// oneDNN's product on inputs whose products and sums are exact in fp32 (multiples of 1/16 in
// [-1, 1], exact in bf16 too), so a correct kernel gives the exact result bitwise; odd sizes
// exercise its edge code. False when oneDNN refuses (dnnl_unimplemented without AVX-512).
bool onednn_probe_exact() {
  constexpr int M = 37, N = 29, K = 43;
  std::vector<bf16> A(static_cast<std::size_t>(M) * K), B(static_cast<std::size_t>(N) * K);
  for (std::size_t i = 0; i < A.size(); ++i)
    A[i] = bf16::from_float(static_cast<float>(int(i * 7 % 33) - 16) / 16);
  for (std::size_t i = 0; i < B.size(); ++i)
    B[i] = bf16::from_float(static_cast<float>(int(i * 5 % 31) - 15) / 16);
  std::vector<float> C(static_cast<std::size_t>(M) * N, -7.0f);
  if (!pin_onednn_threads() ||
      !onednn_gemm(false, true, M, N, K, A.data(), K, B.data(), K, C.data(), N, false))
    return false;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double exact = 0;
      for (int k = 0; k < K; ++k)
        exact +=
            double(A[std::size_t(m) * K + k].to_float()) * B[std::size_t(n) * K + k].to_float();
      if (double(C[std::size_t(m) * N + n]) != exact) return false;
    }
  return true;
}

struct Selection {
  Bf16GemmKernel kernel;
  std::string description;
};

const Selection& selection() {
  static const Selection s = [] {
    const bool avx512_bf16 = cpu_features().avx512_bf16;
    // Probe only where oneDNN is a candidate: elsewhere it would refuse or emulate.
    const bool exact = avx512_bf16 && onednn_probe_exact();
    const Bf16GemmKernel k = choose_bf16_gemm_kernel(avx512_bf16, exact);
    const dnnl_version_t* v = dnnl_version();
    const std::string onednn = "oneDNN " + std::to_string(v->major) + "." +
                               std::to_string(v->minor) + "." + std::to_string(v->patch);
    if (k == Bf16GemmKernel::onednn)
      return Selection{k, onednn + " gemm_bf16bf16f32 (AVX512_BF16)"};
    const std::string sgemm = "bf16 widened to fp32, " + blas_kernel().library + " sgemm";
    if (!avx512_bf16) return Selection{k, sgemm + " (no AVX512_BF16: " + onednn + " not used)"};
    return Selection{k, sgemm + " (AVX512_BF16, but " + onednn +
                            " gemm_bf16bf16f32 failed its exactness probe)"};
  }();
  return s;
}

}  // namespace

const char* bf16_gemm_kernel_name(Bf16GemmKernel k) {
  return k == Bf16GemmKernel::onednn ? "oneDNN" : "sgemm";
}

Bf16GemmKernel choose_bf16_gemm_kernel(bool cpu_has_avx512_bf16, bool onednn_probe_exact) {
  return cpu_has_avx512_bf16 && onednn_probe_exact ? Bf16GemmKernel::onednn : Bf16GemmKernel::sgemm;
}

Bf16GemmKernel bf16_gemm_kernel() {
  return selection().kernel;
}

std::string describe_bf16_gemm() {
  return selection().description;
}

Bf16GemmCalls& bf16_gemm_calls() {
  thread_local Bf16GemmCalls calls;
  return calls;
}

void ensure_onednn_single_threaded() {
  thread_local const bool pinned = pin_onednn_threads();
  (void)pinned;
}

bool bf16_gemm_on(Bf16GemmKernel kernel, bool transpose_a, bool transpose_b, int M, int N, int K,
                  const bf16* A, int lda, const bf16* B, int ldb, float* C, int ldc,
                  bool accumulate) {
  if (M == 0 || N == 0) return true;
  ComputeSpan span("gemm_bf16", 2.0 * M * N * K);
  if (dry_run()) return true;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  if (K == 0) {  // no products: C = 0 or C as it is (both kernels would check ld >= 1 first)
    for (int m = 0; m < M && !accumulate; ++m)
      for (int n = 0; n < N; ++n) C[static_cast<std::size_t>(m) * ldc + n] = 0.0f;
    return true;
  }
  const auto start = std::chrono::steady_clock::now();
  if (kernel == Bf16GemmKernel::onednn) {
    if (!onednn_gemm(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate))
      return false;
    bf16_gemm_calls().onednn += 1;
  } else {
    sgemm_widened(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    bf16_gemm_calls().sgemm += 1;
  }
  const auto stop = std::chrono::steady_clock::now();
  GemmCounters& c = gemm_counters();
  c.calls += 1;
  c.nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(stop - start).count();
  c.flops += 2.0 * M * N * K;
  return true;
}

namespace {

// The wrappers' product on the selected kernel; a refusal after the exact probe succeeded would be
// a oneDNN fault, not a property of the machine.
void gemm(bool ta, bool tb, int M, int N, int K, const bf16* A, int lda, const bf16* B, int ldb,
          float* C, int ldc, bool accumulate) {
  const Bf16GemmKernel k = bf16_gemm_kernel();
  if (!bf16_gemm_on(k, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate))
    throw std::runtime_error("bf16 GEMM: " + describe_bf16_gemm() + " refused a " +
                             std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                             " product after passing its probe");
}

}  // namespace

void matmul_nt(float* C, const bf16* A, const bf16* B, int M, int N, int K, bool accumulate,
               int lda, int ldb, int ldc) {
  gemm(false, true, M, N, K, A, lda < 0 ? K : lda, B, ldb < 0 ? K : ldb, C, ldc < 0 ? N : ldc,
       accumulate);
}

void matmul_nn(float* C, const bf16* A, const bf16* B, int M, int N, int K, bool accumulate,
               int lda, int ldb, int ldc) {
  gemm(false, false, M, N, K, A, lda < 0 ? K : lda, B, ldb < 0 ? N : ldb, C, ldc < 0 ? N : ldc,
       accumulate);
}

void matmul_tn(float* C, const bf16* A, const bf16* B, int M, int N, int K, bool accumulate,
               int lda, int ldb, int ldc) {
  gemm(true, false, M, N, K, A, lda < 0 ? M : lda, B, ldb < 0 ? N : ldb, C, ldc < 0 ? N : ldc,
       accumulate);
}

}  // namespace tspemu::ref
