// Benchmarks of the dense reference: one Llama layer, forward and forward+backward, fp32, at the
// issue's shape (C=1024, NH=NKV=16, F=2816, T=2048, B=1), single-threaded.
//
// Reported per run: real time (ms), FLOP/s, and gemm_share = time inside BLAS calls / total time
// (from the per-thread matmul.hpp counters), i.e. how close the non-GEMM loops are to free.
// FLOPs are the model's useful work: projections 2·N·C·(2·qd + 2·kvd), MLP 2·N·C·F·3, attention
// 4·NH·hs·(visible query-key pairs, T(T+1)/2 per sequence); backward counted as 2x forward (the
// recomputed Q·Kᵀ in the attention backward is overhead, not counted).
// Compare with PyTorch on the same machine: /usr/bin/python3 bench/torch_layer_bench.py.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "blas_main.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/model.hpp"

namespace {

using namespace tspemu::ref;

constexpr int kB = 1, kT = 2048;

ModelConfig layer_config() {
  ModelConfig c;
  c.vocab = 32;  // unused: one layer only
  c.hidden = 1024;
  c.n_layers = 1;
  c.n_heads = 16;
  c.n_kv_heads = 16;
  c.ffn = 2816;
  return c;
}

double forward_flops(const ModelConfig& c, int B, int T) {
  const double N = double(B) * T, C = c.hidden, qd = c.q_dim(), kvd = c.kv_dim(), F = c.ffn;
  const double proj = 2 * N * C * (2 * qd + 2 * kvd);
  const double mlp = 2 * N * C * F * 3;
  const double attn = 4.0 * B * c.n_heads * c.head_size() * (double(T) * (T + 1) / 2);
  return proj + mlp + attn;
}

struct LayerFixture {
  ModelConfig cfg = layer_config();
  LayerWeights<float> w = init_weights<float>(cfg, 1).layers[0];
  std::vector<float> x, y, dy, dx;
  std::vector<std::int64_t> pos;
  LayerCache<float> cache;
  LayerFixture() {
    const std::size_t n = std::size_t(kB) * kT * cfg.hidden;
    const auto xd = normal_stream(2, "x", n), dyd = normal_stream(3, "dy", n);
    x.assign(xd.begin(), xd.end());
    dy.assign(dyd.begin(), dyd.end());
    y.resize(n);
    dx.resize(n);
    pos.resize(kT);
    for (int t = 0; t < kT; ++t) pos[t] = t;
  }
};

void report(benchmark::State& state, double flops_per_iter, std::int64_t total_ns) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_iter, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gemm_share"] = double(gemm_counters().nanoseconds) / double(total_ns);
}

void BM_LayerForward(benchmark::State& state) {
  LayerFixture f;
  layer_forward(f.cfg, f.w, f.x.data(), f.y.data(), f.pos.data(), kB, kT, f.cache);  // warm-up
  gemm_counters() = {};
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    layer_forward(f.cfg, f.w, f.x.data(), f.y.data(), f.pos.data(), kB, kT, f.cache);
    benchmark::DoNotOptimize(f.y.data());
  }
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  report(state, forward_flops(f.cfg, kB, kT), ns);
}

void BM_LayerForwardBackward(benchmark::State& state) {
  LayerFixture f;
  LayerWeights<float> grads = LayerWeights<float>::zeros(f.cfg);
  layer_forward(f.cfg, f.w, f.x.data(), f.y.data(), f.pos.data(), kB, kT, f.cache);
  gemm_counters() = {};
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    layer_forward(f.cfg, f.w, f.x.data(), f.y.data(), f.pos.data(), kB, kT, f.cache);
    layer_backward(f.cfg, f.w, f.x.data(), f.dy.data(), f.dx.data(), f.pos.data(), kB, kT, f.cache,
                   grads);
    benchmark::DoNotOptimize(f.dx.data());
  }
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  report(state, 3 * forward_flops(f.cfg, kB, kT), ns);
}

BENCHMARK(BM_LayerForward)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_LayerForwardBackward)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);

}  // namespace

int main(int argc, char** argv) {
  return tspemu::bench::blas_benchmark_main(argc, argv);
}
