// The analytic cost model (cost_model.hpp) against the measurement and against the paper.
// (a) A TspLayer run on small configs (D 1..4 incl. 3, GQA, B 1/2, head buckets 1/2, the keep
//     options on/off): the runtime's counters by collective kind (calls, bytes sent, bytes
//     received) and the arena's category peaks, overall peak, phase peaks and end state, forward
//     and backward, equal the model exactly, in bytes, on every rank (also for a second and third
//     step). The same for the baselines' layer (TP, Megatron-SP, SP, TP+SP meshes, degrees up to
//     4 incl. 3, GQA, B 1/2).
// (b) The paper's 7B-class model, D = T = 8, B = 1: TSP/TP forward volume = 1/2 + 4h/(B·S) and it
//     crosses 1 at B·S = 8h (paper convention); runtime counting agrees where it should.
// (c) Per-device memory of the 7B-class model at 128K tokens: TSP < TP < TP+SP (the paper's two
//     factorizations); TSP is lowest at every length from 16K to 128K. The numbers are printed.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_attention.hpp"
#include "tspemu/tsp/baseline_mlp.hpp"
#include "tspemu/tsp/cost_model.hpp"
#include "tspemu/tsp/ring_attention.hpp"
#include "tspemu/tsp/sequence_sharded_attention.hpp"
#include "tspemu/tsp/tsp_layer.hpp"
#include "tspemu/tsp/ulysses_attention.hpp"

namespace tspemu::tsp::testing {
namespace {

using cost::CategoryBytes;

struct LayerCase {
  int D = 2, g = 1, B = 1, buckets = 1;
  bool keep_shards = false, keep_kv = false;
  int steps = 1;
  std::string name() const {
    return "D=" + std::to_string(D) + " g=" + std::to_string(g) + " B=" + std::to_string(B) +
           " buckets=" + std::to_string(buckets) + " keep_shards=" + std::to_string(keep_shards) +
           " keep_kv=" + std::to_string(keep_kv) + " steps=" + std::to_string(steps);
  }
  TspShape shape() const {
    TspShape s;
    const int nkv = 2 * D;  // 2 KV heads per rank: head_buckets 1 or 2
    s.model.vocab = 16;
    s.model.n_kv_heads = nkv;
    s.model.n_heads = nkv * g;
    s.model.hidden = s.model.n_heads * 8;
    s.model.n_layers = 1;
    s.model.ffn = 3 * s.model.hidden;
    s.D = D;
    s.B = B;
    s.S = 4 * D;
    s.options.head_buckets = buckets;
    s.options.keep_attention_shards = keep_shards;
    s.options.keep_kv = keep_kv;
    return s;
  }
};

struct Measured {
  CategoryBytes base{}, resident{};
  ArenaStats forward, backward;
  std::map<std::string, std::size_t, std::less<>> forward_phases, backward_phases;
  TrafficCounters fwd, bwd;
};

// Builds blocks with build() and records the arena's categories before (m.base) and what the
// blocks hold after construction (m.resident).
template <class Build>
auto build_measured(Arena& a, Measured& m, Build build) {
  for (std::size_t c = 0; c < kCategoryCount; ++c) m.base[c] = a.stats().category_current[c];
  auto blocks = build();
  for (std::size_t c = 0; c < kCategoryCount; ++c)
    m.resident[c] = a.stats().category_current[c] - m.base[c];
  return blocks;
}

// `steps` training steps of rank r (forward(), then backward()); the last one is measured into m:
// counters and arena per pass, peaks restarted at the start of each pass, as the model reports it.
template <class Forward, class Backward>
void measure_steps(Rank& r, Measured& m, int steps, Forward forward, Backward backward) {
  Arena& a = r.arena();
  for (int step = 0; step < steps; ++step) {
    if (step > 0) a.reset_peaks();
    r.counters().clear();
    forward();
    m.fwd = r.counters();
    m.forward = a.stats();
    m.forward_phases = a.phase_peaks();
    a.reset_peaks();
    r.counters().clear();
    backward();
    m.bwd = r.counters();
    m.backward = a.stats();
    m.backward_phases = a.phase_peaks();
  }
}

// `steps` forward + backward steps on one layer; the last one is measured.
std::vector<Measured> run_layer(const TspShape& s, int steps) {
  auto w = ref::convert_weights<float>(ref::init_weights<double>(s.model, 3));
  const std::size_t local = static_cast<std::size_t>(s.B) * s.Tl() * s.model.hidden;
  World world({.ranks = s.D});
  std::vector<Measured> out(static_cast<std::size_t>(s.D));
  world.run([&](Rank& r) {
    Measured& m = out[static_cast<std::size_t>(r.id())];
    Arena& a = r.arena();
    const auto layer =
        build_measured(a, m, [&] { return std::make_unique<TspLayer>(r, s, w.layers[0]); });
    // The harness's own buffers (constant through the step): x, y activations; dx workspace.
    auto x = a.allocate<float>(local, Category::activations, true);
    auto y = a.allocate<float>(local, Category::activations);
    auto dx = a.allocate<float>(local, Category::workspace);
    measure_steps(
        r, m, steps, [&] { layer->forward(x.data(), y.data()); },
        [&] { layer->backward(x.data(), y.data(), dx.data()); });
  });
  return out;
}

std::uint64_t charged_floats(std::size_t n) {
  return (n * 4 + 63) / 64 * 64;
}

void expect_traffic(const TrafficCounters& got, const cost::Traffic& want,
                    const std::string& what) {
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const char* kind = collective_name(static_cast<CollectiveKind>(k));
    EXPECT_EQ(got.by_kind[k].calls, want.calls[k]) << what << " calls of " << kind;
    EXPECT_EQ(got.by_kind[k].bytes_sent, want.sent[k]) << what << " bytes sent by " << kind;
    EXPECT_EQ(got.by_kind[k].bytes_received, want.received[k])
        << what << " bytes received by " << kind;
  }
}

void expect_pass(const ArenaStats& got,
                 const std::map<std::string, std::size_t, std::less<>>& got_phases,
                 const cost::PassMemory& want, const CategoryBytes& extra,
                 const std::string& what) {
  std::uint64_t extra_total = 0;
  for (std::uint64_t v : extra) extra_total += v;
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const char* cat = category_name(static_cast<Category>(c));
    EXPECT_EQ(got.category_peak[c], want.category_peak[c] + extra[c]) << what << " peak " << cat;
    EXPECT_EQ(got.category_current[c], want.end[c] + extra[c]) << what << " end " << cat;
  }
  EXPECT_EQ(got.peak, want.peak + extra_total) << what << " overall peak";
  EXPECT_EQ(got_phases.size(), want.phase.size()) << what << " phases";
  for (const auto& [name, bytes] : want.phase) {
    auto it = got_phases.find(name);
    ASSERT_NE(it, got_phases.end()) << what << " phase " << name << " not recorded";
    EXPECT_EQ(it->second, bytes + extra_total) << what << " phase " << name;
  }
}

TEST(CostModel, TspLayerTrafficAndMemoryEqualTheMeasurementExactly) {
  std::vector<LayerCase> cases;
  cases.push_back({1, 1, 1, 1, false, false});
  cases.push_back({1, 2, 2, 2, true, true});
  for (int D : {2, 3, 4})
    for (int g : {1, 2})
      for (int B : {1, 2})
        for (int buckets : {1, 2})
          for (int keep : {0, 1, 2, 3})
            cases.push_back({D, g, B, buckets, (keep & 1) != 0, (keep & 2) != 0});
  for (const LayerCase& lc : cases) {
    SCOPED_TRACE(lc.name());
    const TspShape s = lc.shape();
    const cost::ModelShape m = cost::ModelShape::from(s.model, s.B, s.S);
    const cost::CostOptions opt = cost::CostOptions::from(s.options);
    const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
    const cost::TspLayerMemory mem = cost::tsp_layer_memory(m, s.D, opt, es, lc.steps);
    const std::vector<Measured> got = run_layer(s, lc.steps);
    const std::size_t local = static_cast<std::size_t>(s.B) * s.Tl() * s.model.hidden;
    for (int r = 0; r < s.D; ++r) {
      const Measured& g = got[static_cast<std::size_t>(r)];
      const std::string what = "rank " + std::to_string(r);
      const cost::LayerTraffic t = cost::layer_traffic(m, cost::Strategy::tsp(s.D), es, opt, r);
      expect_traffic(g.fwd, t.forward, what + " forward");
      expect_traffic(g.bwd, t.backward, what + " backward");
      EXPECT_EQ(g.resident, mem.resident) << what << " resident after construction";
      CategoryBytes extra = g.base;
      extra[static_cast<std::size_t>(Category::activations)] += 2 * charged_floats(local);
      extra[static_cast<std::size_t>(Category::workspace)] += charged_floats(local);
      expect_pass(g.forward, g.forward_phases, mem.forward, extra, what + " forward");
      expect_pass(g.backward, g.backward_phases, mem.backward, extra, what + " backward");
    }
  }
}

// `steps` forward + backward steps of one mesh layer — the attention block `make` builds (after the
// baseline measured), then BaselineMlp — on every rank; the last step is measured.
template <class MakeAttention>
std::vector<Measured> run_mesh_layer(const BaselineShape& s, int steps, MakeAttention make) {
  auto w = ref::convert_weights<float>(ref::init_weights<double>(s.model, 3));
  const std::size_t local = static_cast<std::size_t>(s.B) * s.rows() * s.model.hidden;
  World world({.ranks = s.ranks()});
  std::vector<Measured> got(static_cast<std::size_t>(s.ranks()));
  world.run([&](Rank& r) {
    Measured& m = got[static_cast<std::size_t>(r.id())];
    Arena& a = r.arena();
    auto [att, mlp] = build_measured(a, m, [&] {
      auto attention = make(r, s, w.layers[0]);  // first: a core allocates before its block
      return std::pair{std::move(attention), std::make_unique<BaselineMlp>(r, s, w.layers[0])};
    });
    auto x = a.allocate<float>(local, Category::activations, true);
    auto mid = a.allocate<float>(local, Category::activations);
    auto y = a.allocate<float>(local, Category::activations);
    auto dmid = a.allocate<float>(local, Category::workspace);
    auto dx = a.allocate<float>(local, Category::workspace);
    measure_steps(
        r, m, steps,
        [&] {
          att->forward(x.data(), mid.data());
          mlp->forward(mid.data(), y.data());
        },
        [&] {
          mlp->backward(mid.data(), y.data(), dmid.data());
          att->backward(x.data(), dmid.data(), dx.data());
        });
  });
  return got;
}

// Every rank's counters and arena against layer_traffic and baseline_layer_memory for st.
void expect_mesh_layer(const BaselineShape& s, const cost::Strategy& st, int steps,
                       const std::vector<Measured>& got) {
  const cost::ModelShape m = cost::ModelShape::from(s.model, s.B, s.S);
  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  const cost::LayerArenaMemory mem = cost::baseline_layer_memory(m, st, es, steps);
  const std::size_t local = static_cast<std::size_t>(s.B) * s.rows() * s.model.hidden;
  for (int r = 0; r < s.ranks(); ++r) {
    const Measured& g = got[static_cast<std::size_t>(r)];
    const std::string what = "rank " + std::to_string(r);
    const auto t = cost::layer_traffic(m, st, es, {}, r);
    expect_traffic(g.fwd, t.forward, what + " forward");
    expect_traffic(g.bwd, t.backward, what + " backward");
    EXPECT_EQ(g.resident, mem.resident) << what << " resident after construction";
    CategoryBytes extra = g.base;  // the harness's x, mid, y and dmid, dx
    extra[static_cast<std::size_t>(Category::activations)] += 3 * charged_floats(local);
    extra[static_cast<std::size_t>(Category::workspace)] += 2 * charged_floats(local);
    expect_pass(g.forward, g.forward_phases, mem.forward, extra, what + " forward");
    expect_pass(g.backward, g.backward_phases, mem.backward, extra, what + " backward");
  }
}

ref::ModelConfig mesh_model(int n_kv_heads, int g) {
  ref::ModelConfig model;
  model.vocab = 16;
  model.n_kv_heads = n_kv_heads;
  model.n_heads = n_kv_heads * g;
  model.hidden = model.n_heads * 8;
  model.n_layers = 1;
  model.ffn = 3 * model.hidden;
  return model;
}

// The baselines' layer (BaselineAttention then BaselineMlp) on the T × Sp mesh: counters by kind
// (calls, sent, received) and the arena (category peaks, overall and phase peaks, end state),
// forward and backward, equal the model on every rank; B = 2 runs two steps and measures the
// second.
TEST(CostModel, BaselineLayerTrafficAndMemoryEqualTheMeasurementExactly) {
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
        BaselineShape s;
        s.model = mesh_model(2 * mesh.T, g);
        s.T = mesh.T;
        s.Sp = mesh.Sp;
        s.B = B;
        s.S = 4 * mesh.T * mesh.Sp;
        s.sequence_parallel = mesh.msp;
        const int steps = B;
        const cost::Strategy st = mesh.msp       ? cost::Strategy::megatron_sp(mesh.T)
                                  : mesh.Sp == 1 ? cost::Strategy::tp(mesh.T)
                                  : mesh.T == 1  ? cost::Strategy::sp(mesh.Sp)
                                                 : cost::Strategy::tp_sp(mesh.T, mesh.Sp);
        SCOPED_TRACE(st.name() + " g=" + std::to_string(g) + " B=" + std::to_string(B) +
                     " steps=" + std::to_string(steps));
        expect_mesh_layer(
            s, st, steps,
            run_mesh_layer(s, steps,
                           [](Rank& r, const BaselineShape& sh, const ref::LayerWeights<float>& w) {
                             return std::make_unique<BaselineAttention>(r, sh, w);
                           }));
      }
}

// Ulysses and ring attention (SequenceShardedAttention with its core, then the SP BaselineMlp):
// the same exactness at n = 1..4 (Ulysses where n divides the KV heads), MHA and GQA, B 1/2 (two
// steps at B = 2).
TEST(CostModel, UlyssesAndRingLayerTrafficAndMemoryEqualTheMeasurementExactly) {
  for (bool ulysses : {true, false})
    for (int n : {1, 2, 3, 4})
      for (int g : {1, 2})
        for (int B : {1, 2}) {
          BaselineShape s = BaselineShape::sp(mesh_model(n == 3 ? 3 : 4, g), n, B, 4 * n);
          const cost::Strategy st = ulysses ? cost::Strategy::ulysses(n) : cost::Strategy::ring(n);
          SCOPED_TRACE(st.name() + " g=" + std::to_string(g) + " B=" + std::to_string(B));
          expect_mesh_layer(
              s, st, B,
              run_mesh_layer(
                  s, B,
                  [ulysses](Rank& r, const BaselineShape& sh, const ref::LayerWeights<float>& w) {
                    auto core =
                        ulysses ? ulysses_attention_core(r, sh) : ring_attention_core(r, sh);
                    return std::make_unique<SequenceShardedAttention>(r, sh, w, std::move(core));
                  }));
        }
}

TEST(CostModel, LaterStepsHoldThePreviousMlpActivationsThroughTheAttentionForward) {
  const TspShape s = LayerCase{2, 1, 1, 1, false, false, 1}.shape();
  const cost::ModelShape m = cost::ModelShape::from(s.model, s.B, s.S);
  const auto one = cost::tsp_layer_memory(m, s.D, {}, cost::ElementSizes::fp32_emulator(), 1);
  const auto two = cost::tsp_layer_memory(m, s.D, {}, cost::ElementSizes::fp32_emulator(), 2);
  std::uint64_t mlp_kept = 0;
  for (const cost::Allocation& a : one.allocations)
    if (a.name.rfind("mlp: ", 0) == 0 && a.lifetime == "step") mlp_kept += a.charged;
  const std::uint64_t grads =
      two.forward.end[static_cast<std::size_t>(Category::gradients)];  // kept from step 1
  EXPECT_GT(grads, 0u);
  EXPECT_EQ(two.forward.phase.at("attention"),
            one.forward.phase.at("attention") + mlp_kept + grads);
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
    std::printf("  %-20s %8s %8s %8s %8s %8s %8s\n", "strategy", "weights", "grads", "optim",
                "activ", "transnt", "total");
    std::vector<double> total;
    for (const cost::Strategy& st : strategies) {
      const cost::DeviceMemory d = cost::device_memory(m, st);
      total.push_back(d.total());
      std::printf("  %-20s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", st.name().c_str(), gb(d.weights),
                  gb(d.gradients), gb(d.optimizer), gb(d.activations), gb(d.transient),
                  gb(d.total()));
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

TEST(CostModel, RejectsShapesTheImplementationRejects) {
  cost::ModelShape m = cost::paper_7b(1, 1024);
  EXPECT_THROW(cost::layer_traffic(m, cost::Strategy::tsp(3), cost::ElementSizes{}),
               std::invalid_argument);  // 3 ∤ 32 heads
  EXPECT_THROW(cost::tsp_layer_memory(m, 8, {.head_buckets = 3}), std::invalid_argument);
  EXPECT_THROW(cost::layer_traffic(m, cost::Strategy::tsp(8), cost::ElementSizes{}, {}, 8),
               std::invalid_argument);  // rank out of range
}

}  // namespace
}  // namespace tspemu::tsp::testing
