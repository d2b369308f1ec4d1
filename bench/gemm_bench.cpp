// GEMM kernels against OpenBLAS sgemm in the same run, one thread: the bf16 GEMM the reference
// selected (bf16_gemm.hpp: oneDNN's gemm_bf16bf16f32 with AVX512_BF16, widened inputs through
// OpenBLAS sgemm elsewhere) and oneDNN's fp32 dnnl_sgemm (issue 37: keep OpenBLAS as the fp32
// default unless oneDNN measures faster and steadier).
//
// Each iteration runs every kernel once on the same N(0,1) inputs, in turn, so load from other
// processes falls on all of them alike; the counters are medians over the iterations:
//   <kernel>_GFLOPs   2·M·N·K / median seconds of that kernel;
//   bf16_x_sgemm      OpenBLAS sgemm's median time / the bf16 GEMM's (> 1: bf16 is faster);
//   onednn_x_sgemm    OpenBLAS sgemm's median time / dnnl_sgemm's;
//   *_x_sgemm_cpu     the same ratios of thread CPU time, which a shared, loaded machine
//                     disturbs less than wall time (time slices lost to other processes);
//   *_spread          (max - min) / median wall time of that kernel: how steady it ran.
// The label names the bf16 kernel that ran; the context names both kernels in full ("blas",
// "bf16_gemm"). Shapes: 1024³ (issue 37's acceptance shape), and an attention head's Q·Kᵀ
// (2048×2048×64) and P·V (2048×64×2048).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "blas_main.hpp"
#include "tspemu/core/bf16.hpp"
#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/matmul.hpp"

namespace {

using namespace tspemu;
using namespace tspemu::ref;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double spread(const std::vector<double>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return (*hi - *lo) / median(v);
}

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// One kernel's wall and thread-CPU seconds per run.
struct Times {
  std::vector<double> wall, cpu;
  template <class F>
  double run(F&& f) {
    const double c0 = thread_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cpu.push_back(thread_cpu_seconds() - c0);
    return wall.back();
  }
};

// C[M,N] = A[M,K] · B[N,K]ᵀ (the Linear forward layout) on each kernel.
void BM_GemmKernels(benchmark::State& state) {
  const int M = static_cast<int>(state.range(0)), N = static_cast<int>(state.range(1)),
            K = static_cast<int>(state.range(2));
  std::mt19937 gen(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> A(std::size_t(M) * K), B(std::size_t(N) * K), C(std::size_t(M) * N);
  for (float& x : A) x = d(gen);
  for (float& x : B) x = d(gen);
  std::vector<bf16> A16(A.size()), B16(B.size());
  for (std::size_t i = 0; i < A.size(); ++i) A16[i] = bf16::from_float(A[i]);
  for (std::size_t i = 0; i < B.size(); ++i) B16[i] = bf16::from_float(B[i]);
  ensure_blas_single_threaded();
  ensure_onednn_single_threaded();

  auto openblas = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A.data(), K, B.data(), K,
                0.0f, C.data(), N);
  };
  auto bf16_gemm = [&] { matmul_nt(C.data(), A16.data(), B16.data(), M, N, K); };
  auto onednn = [&] {
    if (dnnl_sgemm('N', 'T', M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N) !=
        dnnl_success)
      throw std::runtime_error("dnnl_sgemm failed");
  };
  openblas(), bf16_gemm(), onednn();  // warm-up: packing buffers, JIT kernels, page faults

  Times t_openblas, t_bf16, t_onednn;
  for (auto _ : state)
    state.SetIterationTime(t_openblas.run(openblas) + t_bf16.run(bf16_gemm) + t_onednn.run(onednn));
  const double flops = 2.0 * M * N * K;
  state.counters["openblas_GFLOPs"] = flops / median(t_openblas.wall) / 1e9;
  state.counters["bf16_GFLOPs"] = flops / median(t_bf16.wall) / 1e9;
  state.counters["onednn_sgemm_GFLOPs"] = flops / median(t_onednn.wall) / 1e9;
  state.counters["bf16_x_sgemm"] = median(t_openblas.wall) / median(t_bf16.wall);
  state.counters["onednn_x_sgemm"] = median(t_openblas.wall) / median(t_onednn.wall);
  state.counters["bf16_x_sgemm_cpu"] = median(t_openblas.cpu) / median(t_bf16.cpu);
  state.counters["onednn_x_sgemm_cpu"] = median(t_openblas.cpu) / median(t_onednn.cpu);
  state.counters["openblas_spread"] = spread(t_openblas.wall);
  state.counters["bf16_spread"] = spread(t_bf16.wall);
  state.counters["onednn_spread"] = spread(t_onednn.wall);
  state.SetLabel(std::string("bf16 kernel: ") + bf16_gemm_kernel_name(bf16_gemm_kernel()));
}
BENCHMARK(BM_GemmKernels)
    ->Args({1024, 1024, 1024})
    ->Args({2048, 2048, 64})
    ->Args({2048, 64, 2048})
    ->Iterations(9)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  return tspemu::bench::blas_benchmark_main(argc, argv);
}
