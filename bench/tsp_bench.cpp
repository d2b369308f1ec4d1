// Benchmarks of one TSP layer (attention block + MLP block) at D = 1, 2, 4, 8 ranks against the
// single-thread dense reference layer, in the same run. Shape: C=1024, 16 heads, 16 KV heads,
// F=2816, S=2048, B=1, fp32 (tracker issue 4).
//
// Timing: each iteration is one World::run; the ranks build their shards (untimed), meet at a
// barrier, then rank 0 times forward (or forward+backward) up to a closing barrier, reported with
// UseManualTime. Counters: tokens/s; gemm_GFLOPs = GEMM flops of all ranks / wall time;
// gemm_share = GEMM time summed over ranks / (ranks × wall time) — with more ranks than cores this
// includes time a rank was descheduled inside a GEMM; peak_MiB = the largest per-rank arena peak.
// Ratios (D=2 vs reference, D=8 vs D=2): bench/report_tsp.py.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "blas_main.hpp"
#include "layer_fixture.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/barrier.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/tsp_layer.hpp"

namespace {

using namespace tspemu;

constexpr int kB = 1, kS = 2048;

struct Fixture : bench::LayerFixture {
  Fixture() : LayerFixture(1024, 16, 2816, kB, kS) {}
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

World& world(int D) {
  static std::map<int, std::unique_ptr<World>> worlds;
  auto& w = worlds[D];
  if (!w) w = std::make_unique<World>(WorldOptions{.ranks = D});
  return *w;
}

void BM_ReferenceLayer(benchmark::State& state) {
  const bool backward = state.range(0) != 0;
  Fixture& f = fixture();
  std::vector<std::int64_t> pos(kS);
  for (int t = 0; t < kS; ++t) pos[static_cast<std::size_t>(t)] = t;
  std::vector<float> y(f.x.size()), dx(f.x.size());
  ref::LayerCache<float> cache;
  auto grads = ref::LayerWeights<float>::zeros(f.cfg);
  double gemm_flops = 0, gemm_ns = 0;
  for (auto _ : state) {
    ref::gemm_counters() = {};
    const auto t0 = std::chrono::steady_clock::now();
    ref::layer_forward(f.cfg, f.w, f.x.data(), y.data(), pos.data(), kB, kS, cache);
    if (backward)
      ref::layer_backward(f.cfg, f.w, f.x.data(), f.dy.data(), dx.data(), pos.data(), kB, kS, cache,
                          grads);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    gemm_flops += ref::gemm_counters().flops;
    gemm_ns += static_cast<double>(ref::gemm_counters().nanoseconds);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(kB * kS * iters, benchmark::Counter::kIsRate);
  state.counters["gemm_GFLOPs"] = benchmark::Counter(gemm_flops / 1e9, benchmark::Counter::kIsRate);
  state.counters["gemm_share"] = benchmark::Counter(gemm_ns / 1e9, benchmark::Counter::kIsRate);
}

void BM_TspLayer(benchmark::State& state) {
  const int D = static_cast<int>(state.range(0));
  const bool backward = state.range(1) != 0;
  Fixture& f = fixture();
  tsp::TspShape s;
  s.model = f.cfg;
  s.D = D;
  s.B = kB;
  s.S = kS;
  s.validate();
  World& w = world(D);
  double gemm_flops = 0, gemm_ns = 0;
  std::size_t peak = 0;
  for (auto _ : state) {
    std::vector<double> flops(static_cast<std::size_t>(D)), ns(static_cast<std::size_t>(D));
    double seconds = 0;
    w.run([&](Rank& r) {
      tsp::TspLayer layer(r, s, f.w);
      bench::RankLayerTensors t(r, f, s);
      barrier(r.comm());
      ref::gemm_counters() = {};
      const auto t0 = std::chrono::steady_clock::now();
      layer.forward(t.x.data(), t.y.data());
      if (backward) layer.backward(t.x.data(), t.dy.data(), t.dx.data());
      barrier(r.comm());
      if (r.id() == 0)
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      flops[static_cast<std::size_t>(r.id())] = ref::gemm_counters().flops;
      ns[static_cast<std::size_t>(r.id())] = static_cast<double>(ref::gemm_counters().nanoseconds);
    });
    state.SetIterationTime(seconds);
    for (int r = 0; r < D; ++r) {
      gemm_flops += flops[static_cast<std::size_t>(r)];
      gemm_ns += ns[static_cast<std::size_t>(r)] / D;
      peak = std::max(peak, w.arena(r).stats().peak);
    }
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(kB * kS * iters, benchmark::Counter::kIsRate);
  state.counters["gemm_GFLOPs"] = benchmark::Counter(gemm_flops / 1e9, benchmark::Counter::kIsRate);
  // Rate of (GEMM seconds per rank) over wall seconds: the GEMM share of each rank's time.
  state.counters["gemm_share"] = benchmark::Counter(gemm_ns / 1e9, benchmark::Counter::kIsRate);
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1 << 20);
}

BENCHMARK(BM_ReferenceLayer)
    ->ArgName("backward")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);
BENCHMARK(BM_TspLayer)
    ->ArgNames({"D", "backward"})
    ->ArgsProduct({{1, 2, 4, 8}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);

}  // namespace

int main(int argc, char** argv) {
  return tspemu::bench::blas_benchmark_main(argc, argv);
}
