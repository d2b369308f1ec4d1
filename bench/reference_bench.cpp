// Benchmarks of the dense reference: one Llama layer, forward and forward+backward, fp32, at the
// issue's shape (C=1024, NH=NKV=16, F=2816, T=2048, B=1), single-threaded.
//
// Reported per run: real time (ms), FLOP/s, and gemm_share = time inside BLAS calls / total time
// (from the per-thread matmul.hpp counters), i.e. how close the non-GEMM loops are to free.
// FLOPs are the model's useful work: projections 2·N·C·(2·qd + 2·kvd), MLP 2·N·C·F·3, attention
// 4·NH·hs·(visible query-key pairs, T(T+1)/2 per sequence); backward counted as 2x forward (the
// recomputed Q·Kᵀ in the attention backward is overhead, not counted).
// Compare with PyTorch on the same machine: /usr/bin/python3 bench/torch_layer_bench.py.
//
// BM_DecodeStep: one reference decode step (decode.hpp), fp32, B=1, of the same layer (L=1, V=32)
// against a cache of S=2048 positions; the cache grows by one position per iteration over the
// whole program (S = 2048..~2100, < 3 %). Its memory-traffic bound is the bytes a step must read,
// weights (4·C² + 3·C·F floats at this MHA shape) plus the cache (2·S·NKV·hs floats), over the
// memcpy bandwidth measured in the same run (STREAM's Copy convention: bytes read + bytes written
// over time, median of 5 copies of 128 MiB, 4x a 32 MiB L3); counters bound_ms and
// x_bound = time / bound. PyTorch's KV-cached step:
// /usr/bin/python3 bench/torch_decode_bench.py; both, alternated, with their ratio, the bound and
// TSP-W's step: bench/report_decode.py.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "blas_main.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/safetensors.hpp"

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

// Bytes per second moved by std::memcpy over a buffer far larger than the caches, counting the
// bytes read and the bytes written (as STREAM's Copy): median of 5 copies.
double memcpy_bandwidth() {
  const std::size_t n = std::size_t(128) << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  std::vector<double> secs;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(secs.begin(), secs.end());
  return 2.0 * double(n) / secs[2];
}

struct DecodeFixture {
  ModelConfig cfg = layer_config();
  ModelWeights<float> w = init_weights<float>(cfg, 1);
  KvCache<float> cache;
  DecodeFixture() {
    const std::vector<std::vector<std::int32_t>> prompt{std::vector<std::int32_t>(kT, 3)};
    cache = prefill(w, prompt).cache;
  }
  double step_bytes() const {
    const double C = cfg.hidden, F = cfg.ffn, qd = cfg.q_dim(), kvd = cfg.kv_dim();
    const double weights = 2 * C * qd + 2 * C * kvd + 3 * C * F;
    return sizeof(float) * (weights + 2.0 * double(cache.length(0)) * kvd);
  }
};

void BM_DecodeStep(benchmark::State& state) {
  static DecodeFixture f;  // one prefill for every repetition
  static const double bandwidth = memcpy_bandwidth();
  const std::int32_t token = 5;
  double bound_s = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    bound_s += f.step_bytes() / bandwidth;
    auto logits = decode_step(f.w, f.cache, std::span<const std::int32_t>(&token, 1));
    benchmark::DoNotOptimize(logits.data());
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double iters = double(state.iterations());
  state.counters["bound_ms"] = 1e3 * bound_s / iters;
  state.counters["x_bound"] = secs / bound_s;  // includes the bound's own arithmetic (negligible)
  state.counters["memcpy_GB/s"] = bandwidth / 1e9;
  state.counters["bytes/step"] = f.step_bytes();
}

BENCHMARK(BM_DecodeStep)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);

// BM_SafetensorsHeader/N: reading a safetensors file of N one-float tensors (header check, parse
// and per-tensor validation), the cost a checkpoint's header adds to a load. Linear in N: the
// time per tensor (counter us_per_tensor) stays flat from 20,000 to 200,000 tensors.
void BM_SafetensorsHeader(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::string h = "{";
  for (std::size_t i = 0; i < n; ++i) {
    h += (i ? ",\"t" : "\"t") + std::to_string(i) +
         R"(":{"dtype":"F32","shape":[1],"data_offsets":[)" + std::to_string(4 * i) + "," +
         std::to_string(4 * i + 4) + "]}";
  }
  h += "}";
  const std::uint64_t len = h.size();
  std::vector<unsigned char> file(8 + h.size() + 4 * n);
  std::memcpy(file.data(), &len, 8);
  std::memcpy(file.data() + 8, h.data(), h.size());
  for (auto _ : state) {
    const SafetensorsReader r = SafetensorsReader::from_bytes(file);
    benchmark::DoNotOptimize(r.tensors().size());
  }
  state.counters["us_per_tensor"] = benchmark::Counter(
      static_cast<double>(n) * 1e-6,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_SafetensorsHeader)
    ->Arg(20000)
    ->Arg(200000)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);

}  // namespace

int main(int argc, char** argv) {
  return tspemu::bench::blas_benchmark_main(argc, argv);
}
