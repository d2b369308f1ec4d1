// overlap_bench: does a GEMM and a 4 MiB all_gather, overlapped on 2 ranks (iall_gather issued
// before the GEMM, waited after it), take less wall time than in sequence (GEMM, then all_gather)?
//
// Benchmarks (one World::run per iteration; the forms alternate inside it, in an order rotated
// every iteration, so load from other processes hits them alike; the reported time is the
// overlapped form's, per pair):
//   balanced/ranks:2   each rank: one 384^3 GEMM (113 MFLOP) and the all_gather of its 4 MiB block
//   skewed/ranks:2     rank 1 runs two GEMMs per pair, rank 0 one: rank 0 is idle for a GEMM at
//                      every rendezvous — the only idle core time there is to hide a copy in
// Counters (milliseconds per pair, means over the iteration's pairs): sequence, overlapped,
// gemm (the GEMMs alone), gather (the all_gather alone), rank0_in_gather (rank 0's time inside
// all_gather, sequence form: its copies plus its wait for rank 1), rank0_in_wait and
// rank1_in_wait (each rank's time inside wait(), overlapped form), and ratio =
// overlapped / sequence of the same iteration. Run with --benchmark_repetitions=N and read the
// medians.
// What to expect, and why: on 2 cores with 2 busy rank threads (no SMT), a copy can only hide in
// idle core time. Balanced ranks have none (both compute, then both copy): ratio ~1. Skewed, rank 0
// idles a GEMM at every rendezvous. Sequence form: 2T + 2c (rank 0 waits a GEMM for rank 1 to
// enter all_gather, then each copies two blocks). Overlapped form: iall_gather publishes its
// buffers at issue (runtime/transport/early_exposure.hpp), so rank 0, in its wait while rank 1
// still computes, pulls rank 1's block into its own receive buffer and copies its own, then pushes
// its block into rank 1's receive buffer and copies rank 1's own block there; rank 1's wait then
// finds every block in place and only meets rank 0. The pair takes ~max(T + 4c, 2T) instead of
// 2T + 2c (T one GEMM, c one 4 MiB copy): rank 1's copies leave the critical path while rank 0's
// idle time absorbs them, as long as 4c < T. Balanced, a rank arriving just after the other's own
// copies waits for the block copy in flight into its buffers: ratio a little above 1 (measured
// figures: docs/benchmarks.md). rank1_in_wait shows what is left of rank 1's wait.
#include <benchmark/benchmark.h>

#include <array>
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
constexpr std::size_t kGemmFloats = std::size_t{kGemm} * kGemm;

enum class Form { sequence, overlapped, gemm_only, gather_only };
constexpr std::array<Form, 4> kForms = {Form::sequence, Form::overlapped, Form::gemm_only,
                                        Form::gather_only};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void BM_overlap(benchmark::State& state, bool skewed) {
  tspemu::World world({.ranks = 2});
  std::array<double, 4> total{};  // seconds per form, summed over iterations
  double ratio_sum = 0, rank0_in_gather = 0;
  std::array<double, 2> in_wait_total{};  // per rank, overlapped form
  int iteration = 0;
  for (auto _ : state) {
    std::array<double, 4> seconds{};
    double in_gather = 0;
    std::array<double, 2> in_wait{};
    world.run([&](tspemu::Rank& r) {
      std::vector<float> send(kBlockFloats, 1.0f), recv(2 * kBlockFloats);
      std::vector<float> a(kGemmFloats, 0.5f), b(kGemmFloats, 0.25f), c(kGemmFloats);
      const int gemms = skewed && r.id() == 1 ? 2 : 1;
      auto gemm = [&] {
        for (int g = 0; g < gemms; ++g)
          tspemu::ref::matmul_nt(c.data(), a.data(), b.data(), kGemm, kGemm, kGemm);
      };
      // Warm: page faults of the buffers and the BLAS kernel's first call.
      tspemu::all_gather<float>(r.comm(), send, recv);
      gemm();
      for (std::size_t k = 0; k < kForms.size(); ++k) {
        const Form form = kForms[(k + static_cast<std::size_t>(iteration)) % kForms.size()];
        tspemu::barrier(r.comm());
        const auto t0 = Clock::now();
        for (int i = 0; i < kCalls; ++i) {
          switch (form) {
            case Form::sequence: {
              gemm();
              const auto g0 = Clock::now();
              tspemu::all_gather<float>(r.comm(), send, recv);
              if (r.id() == 0) in_gather += seconds_since(g0);
              break;
            }
            case Form::overlapped: {
              tspemu::CollectiveHandle h = tspemu::iall_gather<float>(r.comm(), send, recv);
              gemm();
              const auto w0 = Clock::now();
              h.wait();
              in_wait[static_cast<std::size_t>(r.id())] += seconds_since(w0);
              break;
            }
            case Form::gemm_only:
              gemm();
              break;
            case Form::gather_only:
              tspemu::all_gather<float>(r.comm(), send, recv);
              break;
          }
        }
        tspemu::barrier(r.comm());
        if (r.id() == 0) seconds[static_cast<std::size_t>(form)] = seconds_since(t0) / kCalls;
      }
    });
    state.SetIterationTime(seconds[static_cast<std::size_t>(Form::overlapped)]);
    for (std::size_t f = 0; f < total.size(); ++f) total[f] += seconds[f];
    ratio_sum += seconds[static_cast<std::size_t>(Form::overlapped)] /
                 seconds[static_cast<std::size_t>(Form::sequence)];
    rank0_in_gather += in_gather / kCalls;
    for (std::size_t k = 0; k < 2; ++k) in_wait_total[k] += in_wait[k] / kCalls;
    ++iteration;
  }
  const double n = iteration > 0 ? iteration : 1;
  auto ms = [n](double s) { return benchmark::Counter(s * 1e3 / n); };
  state.counters["sequence_ms"] = ms(total[static_cast<std::size_t>(Form::sequence)]);
  state.counters["overlapped_ms"] = ms(total[static_cast<std::size_t>(Form::overlapped)]);
  state.counters["gemm_ms"] = ms(total[static_cast<std::size_t>(Form::gemm_only)]);
  state.counters["gather_ms"] = ms(total[static_cast<std::size_t>(Form::gather_only)]);
  state.counters["rank0_in_gather_ms"] = ms(rank0_in_gather);
  state.counters["rank0_in_wait_ms"] = ms(in_wait_total[0]);
  state.counters["rank1_in_wait_ms"] = ms(in_wait_total[1]);
  state.counters["ratio"] = benchmark::Counter(ratio_sum / n);
}

BENCHMARK_CAPTURE(BM_overlap, balanced, false)
    ->Name("balanced/ranks:2")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_overlap, skewed, true)
    ->Name("skewed/ranks:2")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  return tspemu::bench::blas_benchmark_main(argc, argv);
}
