// The analytic cost model (cost_model.hpp) against the measurement and against the paper.
// (a) A TspLayer run on small configs (D 1..4 incl. 3, GQA, B 1/2, head buckets 1/2, the keep
//     options on/off): the runtime's counters by collective kind (calls, bytes sent, bytes
//     received) equal the model exactly, in bytes, on every rank (also for a second and third
//     step); and the same layer run dry (measure_layer) measures exactly what the real run
//     measures — the blocks' bytes after construction, category peaks, overall peak, phase peaks
//     and end state of each pass, and the counters. The same for the baselines' layer (TP,
//     Megatron-SP, SP, TP+SP meshes, degrees up to 4 incl. 3, GQA, B 1/2) and for Ulysses and
//     ring attention.
// (b) The paper's 7B-class model, D = T = 8, B = 1: TSP/TP forward volume = 1/2 + 4h/(B·S) and it
//     crosses 1 at B·S = 8h (paper convention); runtime counting agrees where it should.
// (c) Per-device memory of the 7B-class model at 128K tokens: TSP < TP < TP+SP (the paper's two
//     factorizations); TSP is lowest at every length from 16K to 128K. The numbers are printed.
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "layer_measure_checks.hpp"
#include "tspemu/plan/cost_model.hpp"
#include "tspemu/tsp/layer_measure.hpp"
#include "tspemu/tsp/strategy.hpp"

namespace tspemu::tsp::testing {
namespace {

ref::ModelConfig cost_mesh_model(int n_kv_heads, int g) {
  ref::ModelConfig model;
  model.vocab = 16;
  model.n_kv_heads = n_kv_heads;
  model.n_heads = n_kv_heads * g;
  model.hidden = model.n_heads * 8;
  model.n_layers = 1;
  model.ffn = 3 * model.hidden;
  return model;
}

struct LayerCase {
  int D = 2, g = 1, B = 1, buckets = 1;
  bool keep_shards = false, keep_kv = false;
  int steps = 1;
  std::string name() const {
    return "D=" + std::to_string(D) + " g=" + std::to_string(g) + " B=" + std::to_string(B) +
           " buckets=" + std::to_string(buckets) + " keep_shards=" + std::to_string(keep_shards) +
           " keep_kv=" + std::to_string(keep_kv) + " steps=" + std::to_string(steps);
  }
  // 2 KV heads per rank: head_buckets 1 or 2.
  ref::ModelConfig model() const { return cost_mesh_model(2 * D, g); }
  int S() const { return 4 * D; }
  LayerMeasureOptions options(bool dry) const {
    return {.dry = dry,
            .steps = steps,
            .head_buckets = buckets,
            .keep_attention_shards = keep_shards,
            .keep_kv = keep_kv};
  }
};

// The real run's counters against the closed forms; the dry run against the real run.
void expect_layer(const ref::ModelConfig& model, int B, int S, const cost::Strategy& st,
                  const LayerMeasureOptions& real, const cost::CostOptions& opt = {}) {
  LayerMeasureOptions dry = real;
  dry.dry = true;
  const LayerMeasure got = measure_layer(model, B, S, st, real);
  expect_closed_form_traffic(got, cost::ModelShape::from(model, B, S), st, opt);
  expect_dry_equals_real(measure_layer(model, B, S, st, dry), got);
}

TEST(CostModel, TspLayerTrafficEqualsTheMeasurementAndTheDryRunItsMemoryExactly) {
  std::vector<LayerCase> cases;
  cases.push_back({1, 1, 1, 1, false, false});
  cases.push_back({1, 2, 2, 2, true, true});
  for (int D : {2, 3, 4})
    for (int g : {1, 2})
      for (int B : {1, 2})
        for (int buckets : {1, 2})
          for (int keep : {0, 1, 2, 3})
            cases.push_back({D, g, B, buckets, (keep & 1) != 0, (keep & 2) != 0});
  cases.push_back({2, 1, 1, 1, false, false, 2});
  cases.push_back({3, 2, 2, 2, true, false, 3});
  for (const LayerCase& lc : cases) {
    SCOPED_TRACE(lc.name());
    const LayerMeasureOptions real = lc.options(false);
    expect_layer(lc.model(), lc.B, lc.S(), cost::Strategy::tsp(lc.D), real,
                 {lc.buckets, lc.keep_shards, lc.keep_kv});
  }
}

// The baselines' layer (BaselineAttention then BaselineMlp) on the T × Sp mesh: counters by kind
// (calls, sent, received) equal the model on every rank, and the dry run's arena (category peaks,
// overall and phase peaks, end state) equals the real one, forward and backward; B = 2 runs two
// steps and measures the second.
TEST(CostModel, BaselineLayerTrafficEqualsTheMeasurementAndTheDryRunItsMemoryExactly) {
  struct Mesh {
    int T, Sp;
    bool msp;
  };
  const std::vector<Mesh> meshes = {{1, 1, false}, {2, 1, false}, {3, 1, false}, {4, 1, false},
                                    {1, 1, true},  {2, 1, true},  {3, 1, true},  {1, 2, false},
                                    {1, 3, false}, {2, 2, false}, {3, 2, false}, {2, 3, false}};
  for (const Mesh& mesh : meshes)
    for (int g : {1, 2})
      for (int B : {1, 2}) {
        const int steps = B;
        const cost::Strategy st = mesh.msp       ? cost::Strategy::megatron_sp(mesh.T)
                                  : mesh.Sp == 1 ? cost::Strategy::tp(mesh.T)
                                  : mesh.T == 1  ? cost::Strategy::sp(mesh.Sp)
                                                 : cost::Strategy::tp_sp(mesh.T, mesh.Sp);
        SCOPED_TRACE(st.name() + " g=" + std::to_string(g) + " B=" + std::to_string(B) +
                     " steps=" + std::to_string(steps));
        expect_layer(cost_mesh_model(2 * mesh.T, g), B, 4 * mesh.T * mesh.Sp, st,
                     {.dry = false, .steps = steps});
      }
}

// Ulysses and ring attention (SequenceShardedAttention with its core, then the SP BaselineMlp):
// the same exactness at n = 1..4 (Ulysses where n divides the KV heads), MHA and GQA, B 1/2 (two
// steps at B = 2).
TEST(CostModel, UlyssesAndRingLayerTrafficEqualsTheMeasurementAndTheDryRunItsMemoryExactly) {
  for (bool ulysses : {true, false})
    for (int n : {1, 2, 3, 4})
      for (int g : {1, 2})
        for (int B : {1, 2}) {
          const cost::Strategy st = ulysses ? cost::Strategy::ulysses(n) : cost::Strategy::ring(n);
          SCOPED_TRACE(st.name() + " g=" + std::to_string(g) + " B=" + std::to_string(B));
          expect_layer(cost_mesh_model(n == 3 ? 3 : 4, g), B, 4 * n, st,
                       {.dry = false, .steps = B});
        }
}

// From the second step on, the previous step's MLP activations (TspMlp releases them only in its
// next forward) and the gradients are held while the attention forward runs.
TEST(CostModel, LaterStepsHoldThePreviousMlpActivationsThroughTheAttentionForward) {
  const LayerCase lc{2, 1, 1, 1, false, false, 1};
  const ref::ModelConfig m = lc.model();
  const auto one = measure_layer(m, lc.B, lc.S(), cost::Strategy::tsp(lc.D), {.steps = 1});
  const auto two = measure_layer(m, lc.B, lc.S(), cost::Strategy::tsp(lc.D), {.steps = 2});
  auto charged = [](std::size_t floats) { return (floats * 4 + 63) / 64 * 64; };
  const std::size_t M = static_cast<std::size_t>(lc.B) * lc.S() / lc.D;
  const std::size_t mlp_kept =
      charged(M * m.hidden) + charged(M) + 2 * charged(M * static_cast<std::size_t>(m.ffn));
  const std::size_t grads =
      two.ranks[0].forward.category_current[static_cast<std::size_t>(Category::gradients)];
  EXPECT_GT(grads, 0u);
  EXPECT_EQ(two.ranks[0].forward_phases.at("attention"),
            one.ranks[0].forward_phases.at("attention") + mlp_kept + grads);
}

TEST(CostModel, TspTrafficMatchesThePaperConventionWhereTheyAgree) {
  // Forward: received bytes = the TSP-NOTES volume. Backward: equal too when D | h (balanced
  // all-reduce chunks); with D ∤ h the all-reduce makes the runtime's bytes depend on the rank.
  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  for (int D : {2, 3, 4}) {
    cost::ModelShape m;
    m.B = 2;
    m.S = 8 * D;
    m.n_heads = 4 * D;
    m.n_kv_heads = 2 * D;
    m.hidden = m.n_heads * 8;
    m.ffn = 3 * m.hidden;
    for (int r = 0; r < D; ++r) {
      const auto t = cost::layer_traffic(m, cost::Strategy::tsp(D), es, {}, r);
      EXPECT_DOUBLE_EQ(static_cast<double>(t.forward.total_received()), t.paper_forward);
      EXPECT_DOUBLE_EQ(static_cast<double>(t.backward.total_received()), t.paper_backward);
      EXPECT_DOUBLE_EQ(t.paper_forward,
                       cost::paper_forward_elements(m, cost::Strategy::tsp(D)) * 4);
    }
  }
  // h = 20 over D = 3: chunks 7, 7, 6 → ranks differ, their mean is the ring volume.
  cost::ModelShape m;
  m.B = 1;
  m.S = 6;
  m.n_heads = 3;
  m.n_kv_heads = 3;
  m.hidden = 30;
  m.ffn = 30;
  EXPECT_EQ(cost::all_reduce_bytes(20, 3, 0, 4), (13 + 2 * 7) * 4u);
  EXPECT_EQ(cost::all_reduce_bytes(20, 3, 2, 4), (14 + 2 * 6) * 4u);
  EXPECT_EQ(cost::all_reduce_bytes(20, 3, 0, 4) + cost::all_reduce_bytes(20, 3, 1, 4) +
                cost::all_reduce_bytes(20, 3, 2, 4),
            3 * 2 * 2 * 20 * 4u / 3);
}

// TSP-NOTES: Ulysses moves 4 all-to-alls of B·(S/n)-token tensors ((n-1)/n of each; K and V at
// the KV width), ring attention the SP volume 2(n-1)/n·B·S·h/g by n-1 hops. The runtime's bytes
// equal the paper convention forward and backward when n divides every count.
TEST(CostModel, UlyssesAndRingForwardVolumesAreTheNotesFormulasAndTheRuntimeAgrees) {
  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  for (int n : {2, 4, 8}) {
    // g = 2, hs = 8, F = 3h
    cost::ModelShape m{
        .B = 2, .S = 16 * n, .hidden = 16 * n, .n_heads = 2 * n, .n_kv_heads = n, .ffn = 48 * n};
    const double BS = static_cast<double>(m.B * m.S), h = static_cast<double>(m.hidden);
    const double frac = (n - 1.0) / n;
    const auto u = cost::Strategy::ulysses(n), r = cost::Strategy::ring(n);
    EXPECT_DOUBLE_EQ(cost::paper_forward_elements(m, u), frac * BS / n * (2 * h + 2 * h / 2));
    EXPECT_DOUBLE_EQ(cost::paper_forward_elements(m, r), 2 * frac * BS * h / 2);
    EXPECT_DOUBLE_EQ(cost::paper_forward_elements(m, r),
                     cost::paper_forward_elements(m, cost::Strategy::sp(n)));
    for (const cost::Strategy& st : {u, r})
      for (int rank = 0; rank < n; ++rank) {
        const auto t = cost::layer_traffic(m, st, es, {}, rank);
        EXPECT_DOUBLE_EQ(t.paper_forward, cost::paper_forward_elements(m, st) * 4) << st.name();
        EXPECT_DOUBLE_EQ(static_cast<double>(t.forward.total_received()), t.paper_forward)
            << st.name();
        EXPECT_DOUBLE_EQ(static_cast<double>(t.backward.total_received()), t.paper_backward)
            << st.name();
      }
    // Ulysses needs n | the KV heads.
    m.n_kv_heads = n / 2;
    m.n_heads = n;
    m.hidden = 8 * n;
    EXPECT_THROW(cost::layer_traffic(m, u, es), std::invalid_argument);
    EXPECT_NO_THROW(cost::layer_traffic(m, r, es));
  }
}

TEST(CostModel, PaperSevenBTspOverTpForwardVolumeIsHalfPlusFourHOverBSAndCrossesOneAt8h) {
  const cost::ElementSizes bf16 = cost::ElementSizes::bf16();
  const double h = 4096;
  for (std::int64_t B : {1, 2})
    for (std::int64_t S : {1024, 4096, 8192, 16384, 32768, 65536, 131072}) {
      const cost::ModelShape m = cost::paper_7b(B, S);
      const double BS = static_cast<double>(B * S);
      const double tsp = cost::paper_forward_elements(m, cost::Strategy::tsp(8));
      const double tp = cost::paper_forward_elements(m, cost::Strategy::tp(8));
      EXPECT_NEAR(tsp / tp, 0.5 + 4 * h / BS, 1e-12) << "B=" << B << " S=" << S;
      // The same ratio in bytes, from the per-layer traffic (paper convention, bf16).
      const auto t_tsp = cost::layer_traffic(m, cost::Strategy::tsp(8), bf16);
      const auto t_tp = cost::layer_traffic(m, cost::Strategy::tp(8), bf16);
      EXPECT_NEAR(t_tsp.paper_forward / t_tp.paper_forward, 0.5 + 4 * h / BS, 1e-12);
      // Runtime counting: TSP forward bytes equal the paper's; TP's all-reduces too (8 | B·S·h).
      EXPECT_DOUBLE_EQ(static_cast<double>(t_tsp.forward.total_received()), t_tsp.paper_forward);
      EXPECT_DOUBLE_EQ(static_cast<double>(t_tp.forward.total_received()), t_tp.paper_forward);
      if (BS < 8 * h) {
        EXPECT_GT(tsp, tp) << "B·S=" << BS << " < 8h: TSP moves more";
      }
      if (BS == 8 * h) {
        EXPECT_DOUBLE_EQ(tsp / tp, 1.0) << "B·S = 8h: equal";
      }
      if (BS > 8 * h) {
        EXPECT_LT(tsp, tp) << "B·S=" << BS << " > 8h: TSP moves less";
      }
    }
  // Parameters per layer (2 + 2/g + 3F)·h² = 16h².
  EXPECT_EQ(cost::paper_7b(1, 1).attention_params() + cost::paper_7b(1, 1).mlp_params(),
            16 * 4096LL * 4096LL);
}

TEST(CostModel, PaperSevenBMemoryPerDeviceOrdersTspBelowTpBelowTpSpAt128K) {
  const std::vector<cost::Strategy> strategies = {
      cost::Strategy::tsp(8),      cost::Strategy::tp(8),       cost::Strategy::megatron_sp(8),
      cost::Strategy::tp_sp(4, 2), cost::Strategy::tp_sp(2, 4), cost::Strategy::tp_sp(1, 8)};
  auto gb = [](double b) { return b / 1e9; };
  for (std::int64_t S : {16384, 32768, 65536, 131072}) {
    const cost::ModelShape m = cost::paper_7b(1, S);
    std::printf("7B-class, B=1, S=%lld, bf16 + fp32 Adam, full recompute (GB per device):\n",
                static_cast<long long>(S));
    std::printf("  %-20s %8s %8s %8s %8s %8s %8s %8s %8s\n", "strategy", "weights", "grads",
                "optim", "activ", "logits", "comm", "work", "total");
    std::vector<double> total;
    for (const cost::Strategy& st : strategies) {
      const cost::DeviceMemory d = cost::device_memory(m, st);
      total.push_back(d.total());
      std::printf("  %-20s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", st.name().c_str(),
                  gb(d.weights), gb(d.gradients), gb(d.optimizer()), gb(d.activations),
                  gb(d.logits), gb(d.comm), gb(d.workspace), gb(d.total()));
    }
    for (std::size_t i = 1; i < total.size(); ++i)
      EXPECT_LT(total[0], total[i]) << "TSP is lowest at S=" << S << " vs " << strategies[i].name();
    if (S == 131072) {
      // TSP-NOTES: TSP 38.8 GB, TP 70.0 GB, TP+SP 85.0 / 140.0 GB (two factorizations; our
      // estimate lands near them for 2x4 and 1x8). TP+SP 4x2 is printed, not ordered: with
      // full recompute this model puts it just below TP.
      EXPECT_LT(total[0], total[1]) << "TSP < TP";
      EXPECT_LT(total[1], total[4]) << "TP < TP+SP 2x4";
      EXPECT_LT(total[4], total[5]) << "TP+SP 2x4 < TP+SP 1x8";
    }
  }
}

// Under full recompute every strategy's backward re-runs its forward: TSP and SP hold the
// re-broadcast / re-gather already; TP, Megatron-SP and TP+SP add their forward TP collectives.
TEST(CostModel, BackwardUnderFullRecomputeHoldsTheRecomputedForwardCollectivesOfEveryStrategy) {
  const cost::ElementSizes bf16 = cost::ElementSizes::bf16();
  const cost::ModelShape m = cost::paper_7b(1, 131072);
  for (const cost::Strategy& st : strategies_at(8)) {
    SCOPED_TRACE(st.name());
    const cost::LayerTraffic t = cost::layer_traffic(m, st, bf16);
    const double extra = t.paper_backward_under(cost::Recompute::full) - t.paper_backward;
    EXPECT_EQ(t.paper_backward_under(cost::Recompute::none), t.paper_backward);
    // The K/V exchange of SP's axis is the backward's own re-gather; the rest of forward is TP's.
    const double sp_kv =
        st.Sp > 1 && !st.attention_core()
            ? 2 * cost::ring_volume(static_cast<double>(m.B * m.S * m.kv_dim()) / st.T, st.Sp) * 2
            : 0.0;
    switch (st.scheme) {
      case cost::Scheme::tsp:
      case cost::Scheme::sp:
        EXPECT_EQ(extra, 0.0);
        break;
      case cost::Scheme::tp:
      case cost::Scheme::megatron_sp:
      case cost::Scheme::tp_sp:
        EXPECT_GT(extra, 0.0);
        EXPECT_DOUBLE_EQ(extra, t.paper_forward - sp_kv);
        break;
      case cost::Scheme::ulysses:  // the output's exchange back to the sequence layout
        EXPECT_DOUBLE_EQ(extra, t.paper_forward / 4);  // g = 1: four equal exchanges
        break;
      case cost::Scheme::ring:  // the K/V hops again, also under selective recompute
        EXPECT_DOUBLE_EQ(extra, t.paper_forward);
        EXPECT_DOUBLE_EQ(t.paper_backward_under(cost::Recompute::selective),
                         t.paper_backward + extra);
        break;
    }
  }
}

// The fp32-emulator precision model's weights and gradients per rank are the bytes every
// strategy's blocks hold after a training step (a layer stack: vocab 0, no embedding or head), on
// every rank, dry at 4 ranks (and TP+SP 2x2), MHA and GQA.
TEST(CostModel, EmulatorParameterStatePerRankIsWhatTheBlocksAllocate) {
  const cost::PrecisionModel fp32 = cost::PrecisionModel::fp32_emulator();
  EXPECT_EQ(fp32.per_param(), 16);
  EXPECT_EQ(fp32.master, 0);
  for (int g : {1, 2}) {
    const ref::ModelConfig model = cost_mesh_model(4, g);
    cost::ModelShape m = cost::ModelShape::from(model, 1, 32);
    m.vocab = 0;
    for (const cost::Strategy& st : strategies_at(4)) {
      SCOPED_TRACE(st.name() + " g=" + std::to_string(g));
      const cost::ParameterState ps = cost::parameter_state_bytes_per_rank(st, m, fp32);
      EXPECT_EQ(ps.moments, 2 * ps.weights);  // m and v, fp32 each
      const LayerMeasure got = measure_layer(model, 1, 32, st, {.dry = true});
      constexpr auto w = static_cast<std::size_t>(Category::weights),
                     gr = static_cast<std::size_t>(Category::gradients);
      for (const RankLayerMeasure& r : got.ranks) {
        EXPECT_EQ(static_cast<double>(r.backward.category_current[w]), ps.weights);
        EXPECT_EQ(static_cast<double>(r.backward.category_peak[w]), ps.weights);
        EXPECT_EQ(static_cast<double>(r.backward.category_current[gr]), ps.gradients);
      }
    }
  }
  // The whole model adds the vocabulary: TSP splits it over D, TP over T, SP replicates.
  const cost::ModelShape p7 = cost::paper_7b(1, 1024);
  const double layer16 = 16.0 * 4096 * 4096, vh = 32000.0 * 4096;
  EXPECT_EQ(cost::parameter_state_bytes_per_rank(cost::Strategy::tsp(8), p7, fp32).params,
            32 * (layer16 / 8 + 2 * 4096) + 2 * vh / 8 + 4096);
  EXPECT_EQ(cost::parameter_state_bytes_per_rank(cost::Strategy::tsp(8), p7, fp32, false).params,
            32 * (layer16 / 8 + 2 * 4096) + 2 * vh + 4096);
  EXPECT_EQ(cost::parameter_state_bytes_per_rank(cost::Strategy::sp(8), p7, fp32).params,
            32 * (layer16 + 2 * 4096) + 2 * vh + 4096);
  EXPECT_EQ(cost::parameter_state_bytes_per_rank(cost::Strategy::tp_sp(2, 4), p7,
                                                 cost::PrecisionModel::megatron_bf16())
                .total(),
            18 * (32 * (layer16 / 2 + 2 * 4096) + 2 * vh / 2 + 4096));
}

// The memory estimate's parts move as their assumptions say: recompute none > selective >= full
// activations; materialized attention adds n_h·S per token only without selective recompute;
// in-place logit gradients halve the logits; a chunk bounds them; the overhead is added apart.
TEST(CostModel, DeviceMemoryPartsFollowTheirAssumptions) {
  const cost::ModelShape m = cost::paper_7b(1, 16384);
  for (const cost::Strategy& st : {cost::Strategy::tsp(8), cost::Strategy::tp(8),
                                   cost::Strategy::megatron_sp(8), cost::Strategy::tp_sp(2, 4)}) {
    SCOPED_TRACE(st.name());
    cost::MemoryAssumptions a;
    const cost::DeviceMemory full = cost::device_memory(m, st, a);
    a.recompute = cost::Recompute::none;
    const cost::DeviceMemory none = cost::device_memory(m, st, a);
    a.recompute = cost::Recompute::selective;
    const cost::DeviceMemory sel = cost::device_memory(m, st, a);
    EXPECT_GT(none.activations, full.activations);
    EXPECT_EQ(sel.activations, none.activations);  // flash attention: nothing to drop
    a.materialized_attention = true;
    EXPECT_EQ(cost::device_memory(m, st, a).activations, sel.activations);
    a.recompute = cost::Recompute::none;
    const double scores = cost::device_memory(m, st, a).activations - none.activations;
    // n_h·S per token per layer, bf16, split like the heads (TSP: tokens / 8; TP: heads / 8).
    EXPECT_DOUBLE_EQ(scores, 32.0 * 16384 * 32 * 16384 * 2 / 8);
    EXPECT_EQ(full.model_states(), full.weights + full.gradients + full.optimizer());
    EXPECT_EQ(full.model_states(), full.params * 16);
    cost::MemoryAssumptions b;
    b.logit_gradient_in_place = true;
    EXPECT_DOUBLE_EQ(cost::device_memory(m, st, b).logits, full.logits / 2);
    b.logit_chunk_tokens = 1;
    EXPECT_LT(cost::device_memory(m, st, b).logits, full.logits / 1000);
    b = {};
    b.framework_overhead = 3e9;
    EXPECT_DOUBLE_EQ(cost::device_memory(m, st, b).total(), full.total() + 3e9);
  }
  cost::MemoryAssumptions bad;
  bad.logit_bytes = -1;
  EXPECT_THROW(cost::device_memory(m, cost::Strategy::tsp(8), bad), std::invalid_argument);
}

// The time model: compute is the FLOP count over peak·MFU (full recompute adds one forward, 4/3 of
// none), TSP hides its communication behind compute where TP exposes its all-reduces, replicas
// multiply tokens/s, and bad devices or counts are refused naming them.
TEST(CostModel, StepTimeChargesFlopsOverPeakAndExposesOnlyWhatTheStrategyCannotOverlap) {
  const cost::ModelShape m = cost::paper_7b(1, 131072);
  const cost::DeviceModel dev = cost::DeviceModel::mi300x();
  cost::MemoryAssumptions full, none;
  none.recompute = cost::Recompute::none;
  const cost::StepTime tsp = cost::step_time(m, cost::Strategy::tsp(8), dev, full, 8);
  const cost::StepTime tp = cost::step_time(m, cost::Strategy::tp(8), dev, full, 8);
  // Layers: (3 + 1) forwards of 2·B·S·16h² + 2·B·S²·h; LM head 3 · 2·B·S·V·h; over 8 ranks.
  const double BS = 131072, h = 4096, fwd = 2 * BS * 16 * h * h + 2 * BS * BS * h;
  const double flops = (32 * 4 * fwd + 3 * 2 * BS * 32000 * h) / 8;
  EXPECT_NEAR(tsp.compute, flops / (1307.4e12 * 0.4), 1e-9 * tsp.compute);
  EXPECT_EQ(tp.compute, tsp.compute);
  const cost::StepTime tsp_none = cost::step_time(m, cost::Strategy::tsp(8), dev, none, 8);
  EXPECT_NEAR(tsp.compute - tsp_none.compute, 32 * fwd / 8 / (1307.4e12 * 0.4), 1e-6);
  EXPECT_GT(tsp.comm, 0);
  EXPECT_EQ(tsp.exposed_comm, 0);  // less than compute, prefetched
  EXPECT_GT(tp.exposed_comm, 0.99 * tp.comm);
  EXPECT_GT(tsp.tokens_per_s, tp.tokens_per_s);
  EXPECT_DOUBLE_EQ(tsp.tokens_per_s, BS / tsp.step);
  const cost::StepTime many = cost::step_time(m, cost::Strategy::tsp(8), dev, full, 1024);
  EXPECT_EQ(many.replicas, 128);
  EXPECT_NEAR(many.tokens_per_s, 128 * BS / many.step, 1e-6 * many.tokens_per_s);
  EXPECT_THROW(cost::step_time(m, cost::Strategy::tsp(8), dev, full, 12), std::invalid_argument);
  cost::DeviceModel bad = dev;
  bad.mfu = 0;
  EXPECT_THROW(cost::step_time(m, cost::Strategy::tsp(8), bad, full, 8), std::invalid_argument);
}

// One algorithm convention for both estimates: the simulated clock charges each call exactly the
// cost model's ring formula — the paper convention's bytes per rank over β (all_gather and
// reduce_scatter of N per rank (n-1)/n·nN, all_reduce 2(n-1)/n·N, broadcast, reduce, all_to_all
// (n-1)/n·N, a hop N) plus SimClockModel::latency_steps · α — on the link of its placement.
TEST(CostModel, SimulatedClockChargesEveryCollectiveByTheCostModelsRingFormula) {
  using K = CollectiveKind;
  const double N = 3 * 5 * 7 * 4096;  // bytes of one call on one rank
  for (const SimClockModel& m : {SimClockModel::h100_nvlink(), SimClockModel::mi300x_if()})
    for (bool across : {false, true})
      for (int n : {2, 3, 8}) {
        const double alpha = across ? m.inter_alpha_s : m.alpha_s;
        const double beta = across ? m.inter_beta_bytes_s : m.beta_bytes_s;
        auto formula = [&](K k, double ring_bytes) {
          return ring_bytes / beta + SimClockModel::latency_steps(k, n) * alpha;
        };
        const std::vector<std::pair<K, double>> expected = {
            {K::all_gather, cost::ring_volume(n * N, n)},
            {K::all_gatherv, cost::ring_volume(n * N, n)},
            {K::reduce_scatter, cost::ring_volume(n * N, n)},
            {K::all_reduce, 2 * cost::ring_volume(N, n)},
            {K::broadcast, cost::ring_volume(N, n)},
            {K::reduce, cost::ring_volume(N, n)},
            {K::all_to_all, cost::ring_volume(N, n)},
            {K::send, N}};
        for (const auto& [k, bytes] : expected) {
          SCOPED_TRACE(m.name + " " + collective_name(k) + " n=" + std::to_string(n) +
                       (across ? " across nodes" : " in a node"));
          const double clock = m.collective_seconds(k, static_cast<std::uint64_t>(N), n, across);
          EXPECT_NEAR(clock, formula(k, bytes), 1e-12 * clock);
        }
      }
  // The planner's devices are the clock's presets.
  const cost::DeviceModel mi = cost::DeviceModel::mi300x();
  EXPECT_EQ(mi.peak_flops, SimClockModel::mi300x_if().peak_flops);
  EXPECT_EQ(mi.node.beta_bytes_s, SimClockModel::mi300x_if().beta_bytes_s);
  EXPECT_EQ(mi.network.beta_bytes_s, SimClockModel::mi300x_if().inter_beta_bytes_s);
  EXPECT_EQ(mi.devices_per_node, 8);
  EXPECT_EQ(cost::DeviceModel::h100().network.alpha_s, SimClockModel::h100_nvlink().inter_alpha_s);
}

TEST(CostModel, RejectsShapesTheImplementationRejects) {
  cost::ModelShape m = cost::paper_7b(1, 1024);
  EXPECT_THROW(cost::layer_traffic(m, cost::Strategy::tsp(3), cost::ElementSizes{}),
               std::invalid_argument);  // 3 ∤ 32 heads
  EXPECT_THROW(
      measure_layer(LayerCase{8}.model(), 1, 1024, cost::Strategy::tsp(8), {.head_buckets = 3}),
      std::invalid_argument);  // 3 ∤ the 2 KV heads per rank
  EXPECT_THROW(cost::layer_traffic(m, cost::Strategy::tsp(8), cost::ElementSizes{}, {}, 8),
               std::invalid_argument);  // rank out of range
  m.vocab = 32001;
  EXPECT_THROW(cost::vocab_traffic(m, cost::Strategy::tp(8), cost::ElementSizes{}),
               std::invalid_argument);  // 8 ∤ the vocabulary TP shards
  EXPECT_NO_THROW(cost::vocab_traffic(m, cost::Strategy::sp(8), cost::ElementSizes{}))
      << "SP replicates the vocabulary";
}

// The vocabulary-parallel head of TP moves per-token statistics over the TP group and SP's
// replicated one moves its gradient over the SP group; the measured equality is in
// mesh_model_test.cpp, these are the closed forms' shapes at the paper's size.
TEST(CostModel, VocabTrafficIsTheTpGroupsStatisticsOrTheSpGroupsGradients) {
  const cost::ModelShape m = cost::paper_7b(1, 4096);  // V 32000, h 4096
  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  using K = CollectiveKind;
  const cost::VocabTraffic tp = cost::vocab_traffic(m, cost::Strategy::tp(8), es);
  // embedding all_reduce of [S, h] + sum-exp and target logit all_reduces of [S]
  EXPECT_EQ(tp.forward[K::all_reduce].calls, 3u);
  const std::uint64_t h = 4096, R = 4096, V = 32000;
  EXPECT_EQ(tp.forward[K::all_reduce].bytes_received, 2 * 7 * (R * h + 2 * R) / 8 * 4);
  EXPECT_EQ(tp.forward[K::all_gather].bytes_received, 7 * R * 4);  // per-token maxima
  EXPECT_EQ(tp.backward[K::all_reduce].calls, 1u);  // the head input's gradient; no SP group
  const cost::VocabTraffic sp = cost::vocab_traffic(m, cost::Strategy::sp(8), es);
  // the loss, one double: rank 0 holds its one-element chunk and receives the 7 others'
  EXPECT_EQ(sp.forward.total_received(), 7u * 8);
  // embedding and LM head gradients (V × h each) and the final norm's (h)
  EXPECT_EQ(sp.backward[K::all_reduce].calls, 3u);
  EXPECT_EQ(sp.backward[K::all_reduce].bytes_received, 2 * 7 * (2 * V * h + h) / 8 * 4);
}

}  // namespace
}  // namespace tspemu::tsp::testing
