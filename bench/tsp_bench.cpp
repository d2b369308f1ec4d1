// Benchmarks of one TSP layer (attention block + MLP block) at D = 1, 2, 4, 8 ranks against the
// single-thread dense reference layer, in the same run. Shape: C=1024, 16 heads, 16 KV heads,
// F=2816, S=2048, B=1, fp32 (tracker issue 4).
//
// Timing: each iteration is one World::run; the ranks build their shards (untimed), meet at a
// barrier, then rank 0 times forward (or forward+backward) up to a closing barrier, reported with
// UseManualTime. Counters: tokens/s; gemm_GFLOPs = GEMM flops of all ranks / wall time;
// in_gemm = GEMM time summed over ranks / (ranks × wall time) — with more ranks than cores this
// includes time a rank was descheduled inside a GEMM; peak_MiB = the largest per-rank arena peak.
// Ratios (D=2 vs reference, D=8 vs D=2): bench/report_tsp.py.
// BM_TspwDecodeStep: one TSP-W decode step (tspw_decoder.hpp) at D ranks against the reference
// decode step (reference/decode.hpp) of the same batch, timed in the same iteration; counter
// x_reference = TSP-W seconds / reference seconds per step (the same-run ratio).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "blas_main.hpp"
#include "layer_fixture.hpp"
#include "tspemu/plan/cost_model.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/barrier.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/tsp_layer.hpp"
#include "tspemu/tsp/tspw_decoder.hpp"

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
  state.counters["in_gemm"] = benchmark::Counter(gemm_ns / 1e9, benchmark::Counter::kIsRate);
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
  state.counters["in_gemm"] = benchmark::Counter(gemm_ns / 1e9, benchmark::Counter::kIsRate);
  state.counters["peak_MiB"] = static_cast<double>(peak) / (1 << 20);
}

// ---- GEMM share of a TSP layer (issue 18 item 4) ----------------------------------------------
//
// gemm_share = (the layer's GEMM FLOPs / wall time) / (single-thread sgemm rate x min(D, cores)),
// the sgemm rate measured at a large square shape (2048^3) alone, right before each timed layer
// run (after one untimed warm-up run); the iteration with the median share is reported whole,
// with the lowest and highest share beside it (gemm_share_min, _max). The layer's GEMM
// FLOPs are the cost model's (ModelShape::weight_gemm_flops + attention_core_flops forward, 3x
// that forward+backward): the useful work, so TSP's recomputed Q/K/V projections in backward and
// the masked part of the attention core's key blocks count as overhead. Beside it, to tell the
// causes apart:
//   shapes_share     the same with the sgemm rate at the layer's own GEMM shapes, weighted by
//                    their FLOPs (small or thin GEMMs: packing, K = head size in attention);
//   efficiency_<call>  one of those shapes alone (sgemm_GFLOPs_<call>) over the square rate
//                    measured right after it (layer_gemm_shapes: q, k_v, o, gate_up, down, and the
//                    attention core's scores and pv);
//   in_gemm          the fraction of each rank's wall time spent inside BLAS (the rest: norms,
//                    RoPE, softmax, reordering, collectives and waiting for the other rank);
//   gemm_efficiency  the executed GEMM FLOPs / the time inside BLAS / the square sgemm rate (the
//                    GEMMs' own speed while D ranks run at once: memory bandwidth, shared caches);
//   useful           the model's FLOPs / the executed GEMM FLOPs (recompute, masked keys);
//   sgemm_concurrent_scaling  min(D, cores) threads running the square sgemm at once, summed,
//                    over min(D, cores) x the single-thread rate: the part of gemm_efficiency
//                    the machine imposes (a gemm_share above it is out of reach for the code).
// gemm_share = in_gemm x gemm_efficiency x useful x D / min(D, cores). And, forward only,
//   attn_outside_gemm  the attention core's time outside its GEMMs (masking, softmax: one exp per
//                      visible score), timed alone on one thread at rank 0's shape for each of the
//                      D weight shards, over the layer's time per rank.
//   page_faults_per_rank  minor page faults a rank took inside the timed pass (fresh memory being
//                      touched: 0 when every buffer is reused from an earlier pass).

// One GEMM call as the layer makes it: C [M, N] (+)= A [M, K] · op(B), B [N, K] (matmul_nt) or
// [K, N] (matmul_nn), with the layer's row strides.
struct GemmShape {
  const char* name;
  bool b_transposed;
  int M, N, K, lda, ldb, ldc;
  bool accumulate;
  double flops;  // its FLOPs in one forward of the layer, per rank
};

GemmShape square_shape(int n) {
  return {"square", true, n, n, n, n, n, n, false, 0};
}

// FLOP/s of the GEMM g on this thread, over at least min_seconds.
double sgemm_rate(const GemmShape& g, double min_seconds = 0.25) {
  const auto rows_a = static_cast<std::size_t>(g.M),
             rows_b = static_cast<std::size_t>(g.b_transposed ? g.N : g.K);
  std::vector<float> a(rows_a * static_cast<std::size_t>(g.lda), 0.5f),
      b(rows_b * static_cast<std::size_t>(g.ldb), 0.25f),
      c(static_cast<std::size_t>(g.M) * static_cast<std::size_t>(g.ldc));
  auto call = [&] {
    if (g.b_transposed)
      ref::matmul_nt(c.data(), a.data(), b.data(), g.M, g.N, g.K, g.accumulate, g.lda, g.ldb,
                     g.ldc);
    else
      ref::matmul_nn(c.data(), a.data(), b.data(), g.M, g.N, g.K, g.accumulate, g.lda, g.ldb,
                     g.ldc);
  };
  call();  // warm: pinning, page faults
  int calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double seconds = 0;
  do {
    call();
    ++calls;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (seconds < min_seconds);
  benchmark::DoNotOptimize(c.data());
  return 2.0 * g.M * g.N * g.K * calls / seconds;
}

// Summed FLOP/s of `threads` threads each running sgemm_rate at the square shape n at the same
// time: what min(D, cores) concurrent single-thread GEMMs reach on this machine (shared caches,
// memory bandwidth, power/frequency limits, SMT siblings behind the reported cores).
double concurrent_sgemm_rate(int threads, int n) {
  std::vector<double> rates(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back(
        [&rates, t, n] { rates[static_cast<std::size_t>(t)] = sgemm_rate(square_shape(n)); });
  for (std::thread& th : pool) th.join();
  return std::accumulate(rates.begin(), rates.end(), 0.0);
}

// One rank's forward GEMMs at degree D, by call (tsp_attention.cpp, tsp_mlp.cpp): per weight
// shard, Q, K and V, O, [gate | up] and down; the attention core's products (scores Q·Kᵀ with
// K = hs, P·V with N = hs) per step of two query blocks (256 rows, reference/attention.cpp's
// kForwardRows) against the key prefix (about S/2 keys on average), at the strides of the
// bucket's Q, K/V and output rows.
std::vector<GemmShape> layer_gemm_shapes(const tsp::TspShape& s) {
  const int M = s.B * s.Tl(), C = s.model.hidden, D = s.D, hs = s.hs();
  const int qc = s.NHl() * hs, kc = s.NKVl() * hs, Fl = s.Fl(), keys = s.S / 2, rows = 256;
  auto f = [](double m, double n, double k) { return 2 * m * n * k; };
  const double core = f(M, s.S / 2.0, hs) * s.NHl() * D;  // per product, causal half
  return {{"q", true, M, qc, C, C, C, qc, false, D * f(M, qc, C)},
          {"k_v", true, M, kc, C, C, C, kc, false, D * 2 * f(M, kc, C)},
          {"o", true, M, C, qc, qc, qc, C, true, D * f(M, C, qc)},
          {"gate_up", true, M, 2 * Fl, C, C, C, 2 * Fl, false, D * 2 * f(M, Fl, C)},
          {"down", true, M, C, Fl, Fl, Fl, C, true, D * f(M, C, Fl)},
          {"scores", true, rows, keys, hs, qc, kc, keys, false, core},
          {"pv", false, rows, hs, keys, keys, kc, qc, false, core}};
}

// Seconds of rank 0's attention core for one weight shard outside its GEMMs, on this thread.
double attention_outside_gemm_seconds(const tsp::TspShape& s) {
  const int Tl = s.Tl(), NH = s.NHl(), NKV = s.NKVl(), hs = s.hs();
  const std::size_t rows = static_cast<std::size_t>(s.B) * Tl,
                    keys = static_cast<std::size_t>(s.B) * s.S;
  std::vector<float> q(rows * NH * hs, 0.01f), k(keys * NKV * hs, 0.02f), v(keys * NKV * hs, 0.03f),
      out(q.size()), lse(static_cast<std::size_t>(s.B) * NH * Tl);
  std::vector<std::int64_t> q_pos(static_cast<std::size_t>(Tl)),
      k_pos(static_cast<std::size_t>(s.S));
  const tsp::SequenceLayout layout = s.layout();
  for (int i = 0; i < Tl; ++i) q_pos[static_cast<std::size_t>(i)] = layout.position(0, i);
  std::iota(k_pos.begin(), k_pos.end(), 0);
  const ref::AttentionDims ad{s.B, Tl, s.S, NH, NKV, hs};
  double best = 1e300;
  for (int rep = 0; rep < 3; ++rep) {
    ref::gemm_counters() = {};
    const auto t0 = std::chrono::steady_clock::now();
    ref::causal_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(),
                                  q_pos.data(), k_pos.data(), ad);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, wall - static_cast<double>(ref::gemm_counters().nanoseconds) * 1e-9);
  }
  return best;
}

// One timed run of the layer at degree D (forward, or forward+backward): rank 0's wall seconds
// from a barrier after setup to a barrier after the pass, and per rank the executed GEMM FLOPs,
// the seconds inside BLAS and the minor page faults the pass took (RUSAGE_THREAD: each rank is
// its own thread).
struct LayerRun {
  double seconds = 0, flops = 0, in_blas = 0, page_faults = 0;  // the last three summed over ranks
};

LayerRun run_layer_once(World& w, const Fixture& f, const tsp::TspShape& s, bool backward) {
  const auto D = static_cast<std::size_t>(s.D);
  std::vector<double> flops(D), ns(D), faults(D);
  double seconds = 0;
  auto minor_faults = [] {
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return static_cast<double>(u.ru_minflt);
  };
  w.run([&](Rank& r) {
    tsp::TspLayer layer(r, s, f.w);
    bench::RankLayerTensors t(r, f, s);
    const auto id = static_cast<std::size_t>(r.id());
    barrier(r.comm());
    ref::gemm_counters() = {};
    const double faults0 = minor_faults();
    const auto t0 = std::chrono::steady_clock::now();
    layer.forward(t.x.data(), t.y.data());
    if (backward) layer.backward(t.x.data(), t.dy.data(), t.dx.data());
    barrier(r.comm());
    if (id == 0)
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    faults[id] = minor_faults() - faults0;
    flops[id] = ref::gemm_counters().flops;
    ns[id] = static_cast<double>(ref::gemm_counters().nanoseconds);
  });
  LayerRun run{.seconds = seconds};
  for (std::size_t r = 0; r < D; ++r) {
    run.flops += flops[r];
    run.in_blas += ns[r] / 1e9;
    run.page_faults += faults[r];
  }
  return run;
}

void BM_TspGemmShare(benchmark::State& state) {
  const int D = static_cast<int>(state.range(0));
  const bool backward = state.range(1) != 0;
  Fixture& f = fixture();
  tsp::TspShape s;
  s.model = f.cfg;
  s.D = D;
  s.B = kB;
  s.S = kS;
  // keep: the options that trade memory for the backward's recomputation (re-broadcast shards,
  // re-gathered K/V), to separate the schedule's GEMM efficiency from its recompute.
  s.options.keep_attention_shards = s.options.keep_kv = state.range(2) != 0;
  s.validate();
  const int cores_int = static_cast<int>(std::min<unsigned>(
      static_cast<unsigned>(D), std::max(1U, std::thread::hardware_concurrency())));
  const double concurrent = concurrent_sgemm_rate(cores_int, 2048);
  // Each shape's rate over the square rate measured right after it: its efficiency alone.
  double mix_flops = 0, mix_seconds = 0;
  for (const GemmShape& g : layer_gemm_shapes(s)) {
    const double rate = sgemm_rate(g);
    state.counters[std::string("sgemm_GFLOPs_") + g.name] = rate / 1e9;
    state.counters[std::string("efficiency_") + g.name] =
        rate / sgemm_rate(square_shape(2048), 0.1);
    mix_flops += g.flops;
    mix_seconds += g.flops / rate;
  }
  const double mix = mix_flops / mix_seconds;
  const double softmax = backward ? 0.0 : attention_outside_gemm_seconds(s);
  const auto m = tsp::cost::ModelShape::from(f.cfg, kB, kS);
  const double model_flops =
      (backward ? 3.0 : 1.0) * (m.weight_gemm_flops() + m.attention_core_flops());
  const double cores = cores_int;
  World& w = world(D);
  // Untimed: the first pass of a shape fills the arena's block cache, OpenBLAS's buffers and the
  // RoPE tables; later passes reuse them (what a training step sees).
  run_layer_once(w, f, s, backward);
  // Each iteration times the square sgemm alone (the reference rate) right before the layer, so
  // both see the same machine: a share from a rate measured minutes earlier mixes in whatever
  // the other processes did in between. Reported: the iteration with the median share, whole
  // (its factors multiply to it).
  struct Sample {
    double share, executed_share, square, in_gemm, efficiency, useful, seconds, page_faults;
  };
  std::vector<Sample> samples;
  for (auto _ : state) {
    const double square = sgemm_rate(square_shape(2048), 0.1);
    const LayerRun run = run_layer_once(w, f, s, backward);
    state.SetIterationTime(run.seconds);
    samples.push_back({.share = model_flops / run.seconds / (square * cores),
                       .executed_share = run.flops / run.seconds / (square * cores),
                       .square = square,
                       .in_gemm = run.in_blas / (D * run.seconds),
                       .efficiency = run.flops / run.in_blas / square,
                       .useful = model_flops / run.flops,
                       .seconds = run.seconds,
                       .page_faults = run.page_faults / D});
  }
  std::sort(samples.begin(), samples.end(),
            [](const Sample& a, const Sample& b) { return a.share < b.share; });
  const Sample& med = samples[samples.size() / 2];
  state.counters["sgemm_GFLOPs"] = med.square / 1e9;
  state.counters["sgemm_GFLOPs_shapes"] = mix / 1e9;
  state.counters["layer_GFLOPs"] = model_flops / med.seconds / 1e9;
  state.counters["gemm_share"] = med.share;
  state.counters["gemm_share_min"] = samples.front().share;
  state.counters["gemm_share_max"] = samples.back().share;
  // Issue 18's formula read literally: the FLOP/s of the GEMMs the layer ran, recomputation
  // included, over the same rate (= in_gemm x gemm_efficiency at D <= cores). gemm_share counts
  // only the model's FLOPs (useful x this), so a schedule cannot raise it by recomputing.
  state.counters["gemm_share_executed"] = med.executed_share;
  // The machine's own ceiling for gemm_share: min(D, cores) square sgemms at once over
  // min(D, cores) x one alone (1 when the cores do not slow each other down).
  state.counters["sgemm_concurrent_scaling"] = concurrent / (med.square * cores);
  state.counters["shapes_share"] = model_flops / med.seconds / (mix * cores);
  state.counters["in_gemm"] = med.in_gemm;
  state.counters["gemm_efficiency"] = med.efficiency;
  state.counters["useful"] = med.useful;
  state.counters["page_faults_per_rank"] = med.page_faults;
  if (!backward) state.counters["attn_outside_gemm"] = D * softmax / med.seconds;
}

// ---- TSP-W decode step vs the reference decode step (issue 36) --------------------------------
//
// A small GQA model (C=512, 8 heads, 4 KV heads, F=1408, L=2, V=512, fp32), B=4 sequences with
// prompts of 256 tokens. Each iteration: the reference prefills and times kDecodeSteps steps; one
// World::run in which every rank builds its decoder and prefills (untimed), meets at a barrier,
// then rank 0 times the same kDecodeSteps steps up to a closing barrier. Reported time: TSP-W
// per step; counters: reference_ms per step and x_reference (their ratio, the same run).
constexpr int kDecodeSteps = 8, kDecodeB = 4, kDecodePrompt = 256;

ref::ModelConfig decode_config() {
  ref::ModelConfig c;
  c.vocab = 512;
  c.hidden = 512;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.ffn = 1408;
  return c;
}

void BM_TspwDecodeStep(benchmark::State& state) {
  const int D = static_cast<int>(state.range(0));
  static const ref::ModelConfig cfg = decode_config();
  static const auto weights = ref::init_weights<float>(cfg, 3);
  const std::vector<std::vector<std::int32_t>> prompts(kDecodeB,
                                                       std::vector<std::int32_t>(kDecodePrompt, 7));
  const std::vector<std::int32_t> tokens(kDecodeB, 11);
  tsp::DecodeShape s;
  s.model = cfg;
  s.D = D;
  s.batch = kDecodeB;
  s.max_context = kDecodePrompt + kDecodeSteps;
  s.validate();
  World& w = world(D);
  double reference_s = 0, tspw_s = 0;
  for (auto _ : state) {
    auto pre = ref::prefill(weights, prompts);
    const auto r0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kDecodeSteps; ++i)
      benchmark::DoNotOptimize(ref::decode_step(weights, pre.cache, tokens).data());
    const double ref_step =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count() / kDecodeSteps;
    double step = 0;
    w.run([&](Rank& r) {
      tsp::TspwDecoder dec(r, s, weights);
      dec.prefill(prompts);
      barrier(r.comm());
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kDecodeSteps; ++i)
        benchmark::DoNotOptimize(dec.decode_step(tokens).data());
      barrier(r.comm());
      if (r.id() == 0)
        step = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
               kDecodeSteps;
    });
    state.SetIterationTime(step);
    reference_s += ref_step;
    tspw_s += step;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["reference_ms"] = 1e3 * reference_s / iters;
  state.counters["x_reference"] = tspw_s / reference_s;
  state.counters["tokens_per_s"] = kDecodeB * iters / tspw_s;  // one token per sequence per step
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
// D = 1 beside D = 2: the same schedule without a second rank to wait for.
BENCHMARK(BM_TspGemmShare)
    ->ArgNames({"D", "backward", "keep"})
    ->ArgsProduct({{2, 1}, {0, 1}, {0}})
    ->Args({2, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK(BM_TspwDecodeStep)
    ->ArgName("D")
    ->Arg(4)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);

}  // namespace

int main(int argc, char** argv) {
  return tspemu::bench::blas_benchmark_main(argc, argv);
}
