// overlap_bench: a GEMM and a 4 MiB all_gather on 2 ranks, overlapped (iall_gather issued before
// the GEMM, waited after it) against in sequence (GEMM, then all_gather), wall time.
//
// Benchmarks:
//   sequence/ranks:2       each rank: matmul_nt, then all_gather of its 4 MiB block (recv 8 MiB)
//   overlapped/ranks:2     each rank: iall_gather issued, matmul_nt, wait
//   gemm_only/ranks:2      the GEMMs alone (the baseline of the same run)
// One iteration is one World::run of kCalls pairs; the reported time is per pair (manual time:
// the run's wall time / kCalls). Run with --benchmark_repetitions=N: the medians are the result.
// What to expect (nonblocking.hpp): progress on wait, so the all_gather's copies run in wait(),
// after the GEMM, on the rank's own thread: nothing overlaps in wall time and both forms cost
// about the same; the overlap the non-blocking form buys is on the simulated clock.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <vector>

#include "blas_main.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/runtime/all_gather.hpp"
#include "tspemu/runtime/barrier.hpp"
#include "tspemu/runtime/nonblocking.hpp"
#include "tspemu/runtime/world.hpp"

namespace {

constexpr int kCalls = 10;
constexpr std::size_t kBlockFloats = std::size_t{1} << 20;  // 4 MiB per rank
constexpr int kGemm = 384;                                  // M = N = K: 113 MFLOP

enum class Mode { sequence, overlapped, gemm_only };

void BM_overlap(benchmark::State& state, Mode mode) {
  tspemu::World world({.ranks = 2});
  for (auto _ : state) {
    double seconds = 0;
    world.run([&](tspemu::Rank& r) {
      std::vector<float> send(kBlockFloats, 1.0f), recv(2 * kBlockFloats);
      std::vector<float> a(kGemm * kGemm, 0.5f), b(kGemm * kGemm, 0.25f), c(kGemm * kGemm);
      // Warm: page faults of the buffers and the BLAS kernel's first call.
      tspemu::all_gather<float>(r.comm(), send, recv);
      tspemu::ref::matmul_nt(c.data(), a.data(), b.data(), kGemm, kGemm, kGemm);
      tspemu::barrier(r.comm());
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kCalls; ++i) {
        switch (mode) {
          case Mode::sequence:
            tspemu::ref::matmul_nt(c.data(), a.data(), b.data(), kGemm, kGemm, kGemm);
            tspemu::all_gather<float>(r.comm(), send, recv);
            break;
          case Mode::overlapped: {
            tspemu::CollectiveHandle h = tspemu::iall_gather<float>(r.comm(), send, recv);
            tspemu::ref::matmul_nt(c.data(), a.data(), b.data(), kGemm, kGemm, kGemm);
            h.wait();
            break;
          }
          case Mode::gemm_only:
            tspemu::ref::matmul_nt(c.data(), a.data(), b.data(), kGemm, kGemm, kGemm);
            break;
        }
      }
      tspemu::barrier(r.comm());
      if (r.id() == 0)
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    state.SetIterationTime(seconds / kCalls);
  }
  state.counters["gemm_mflop"] = 2.0 * kGemm * kGemm * kGemm * 1e-6;
  state.counters["gather_MiB"] = 2.0 * kBlockFloats * sizeof(float) / (1 << 20);
}

BENCHMARK_CAPTURE(BM_overlap, sequence, Mode::sequence)
    ->Name("sequence/ranks:2")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_overlap, overlapped, Mode::overlapped)
    ->Name("overlapped/ranks:2")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_overlap, gemm_only, Mode::gemm_only)
    ->Name("gemm_only/ranks:2")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  return tspemu::bench::blas_benchmark_main(argc, argv);
}
