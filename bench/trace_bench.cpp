// Cost of tracing (trace.hpp) on one TSP layer, forward + backward, measured in the same run:
// each iteration runs the layer on a world without tracing and on a world with tracing (and, for
// sim=1, the simulated clock), in alternating order, so machine noise hits both alike. Reported:
// the median time of each and trace_overhead = median(traced) / median(untraced) - 1 (goal: < 5 %).
// Shape: C=512, 8 heads, 8 KV heads, F=1408, S=1024, B=1, fp32.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "blas_main.hpp"
#include "layer_fixture.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/barrier.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/tsp_layer.hpp"

namespace {

using namespace tspemu;

constexpr int kB = 1, kS = 1024;

struct Fixture : bench::LayerFixture {
  Fixture() : LayerFixture(512, 8, 1408, kB, kS) {}
};

// Seconds of one forward + backward of the layer on `w`, timed by rank 0 between barriers.
double layer_seconds(World& w, const Fixture& f, const tsp::TspShape& s) {
  double seconds = 0;
  w.run([&](Rank& r) {
    tsp::TspLayer layer(r, s, f.w);
    bench::RankLayerTensors t(r, f, s);
    barrier(r.comm());
    const auto t0 = std::chrono::steady_clock::now();
    layer.forward(t.x.data(), t.y.data());
    layer.backward(t.x.data(), t.dy.data(), t.dx.data());
    barrier(r.comm());
    if (r.id() == 0)
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  return seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_TraceOverhead(benchmark::State& state) {
  const int D = static_cast<int>(state.range(0));
  const bool sim = state.range(1) != 0;
  static const Fixture f;
  tsp::TspShape s;
  s.model = f.cfg;
  s.D = D;
  s.B = kB;
  s.S = kS;
  s.validate();
  World plain({.ranks = D});
  WorldOptions traced_opts{.ranks = D, .trace = true};
  if (sim) traced_opts.sim_clock = SimClockModel::nvlink_node();
  World traced(traced_opts);
  // Untimed warm-up: first-touch page faults of arenas and trace buffers, the BLAS threads.
  layer_seconds(plain, f, s);
  layer_seconds(traced, f, s);
  std::vector<double> off, on;
  std::size_t events = 0;
  for (auto _ : state) {
    // Alternate which world goes first, so neither always runs on a warmer cache.
    traced.trace().clear();
    const bool plain_first = off.size() % 2 == 0;
    const double first = layer_seconds(plain_first ? plain : traced, f, s);
    const double second = layer_seconds(plain_first ? traced : plain, f, s);
    const double a = plain_first ? first : second, b = plain_first ? second : first;
    off.push_back(a);
    on.push_back(b);
    state.SetIterationTime(a + b);
    events = 0;
    for (int r = 0; r < D; ++r) events += traced.trace().events(r).size();
  }
  state.counters["off_ms"] = median(off) * 1e3;
  state.counters["on_ms"] = median(on) * 1e3;
  state.counters["trace_overhead"] = median(on) / median(off) - 1;
  state.counters["events"] = static_cast<double>(events);
}

BENCHMARK(BM_TraceOverhead)
    ->ArgNames({"D", "sim"})
    ->ArgsProduct({{4, 8}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(9);

}  // namespace

int main(int argc, char** argv) {
  return tspemu::bench::blas_benchmark_main(argc, argv);
}
