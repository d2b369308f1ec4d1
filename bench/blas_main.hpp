// The main() of the benchmark programs that run BLAS: selects the OpenBLAS kernel first (may
// re-execute the program, see tspemu/reference/blas_kernel.hpp), then runs Google Benchmark with
// the kernels in its context ("blas: OpenBLAS 0.3.21 Cooperlake (detected)", and "bf16_gemm:" the
// bf16 GEMM kernel), so every result says which kernel produced it. Use in place of
// BENCHMARK_MAIN():
//   int main(int argc, char** argv) { return tspemu::bench::blas_benchmark_main(argc, argv); }
#pragma once

#include <benchmark/benchmark.h>

#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/blas_kernel.hpp"

namespace tspemu::bench {

inline int blas_benchmark_main(int argc, char** argv) {
  ref::select_best_blas_kernel(argc, argv);  // before Initialize() consumes argv
  benchmark::AddCustomContext("blas", ref::describe_blas());
  benchmark::AddCustomContext("bf16_gemm", ref::describe_bf16_gemm());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace tspemu::bench
