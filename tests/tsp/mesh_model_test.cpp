// Every strategy's whole model (strategy table's make_model: MeshModel for TP, Megatron-SP, SP,
// Ulysses, ring and TP+SP; TspModel behind the same interface) against the dense reference model:
// the loss and every parameter gradient pass the fp64-oracle rule; the loss is bitwise the same on
// every rank and every replica of a parameter holds bitwise the same gradient; each rank's bytes
// per collective equal L × cost::layer_traffic + cost::vocab_traffic; weights and gradients in
// the arena equal L × the dry layer + the vocabulary shards and the final norm.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "layer_measure_checks.hpp"
#include "model_checks.hpp"
#include "oracle_factor.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/tsp/layer_measure.hpp"
#include "tspemu/tsp/mesh_model.hpp"
#include "tspemu/tsp/strategy.hpp"

namespace tspemu::tsp::testing {
namespace {

struct MeshModelCase {
  cost::Strategy st;
  int NH = 8, NKV = 4, B = 1, S = 16, L = 2;
  bool tied = false;
  std::string name() const {
    return st.name() + " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV) +
           " B=" + std::to_string(B) + " S=" + std::to_string(S) + (tied ? " tied" : " untied");
  }
  ref::ModelConfig model() const {
    ref::ModelConfig m;
    m.vocab = 48;  // divisible by every T here; 48 / 4 = 12 ids per shard
    m.hidden = NH * 4;
    m.n_layers = L;
    m.n_heads = NH;
    m.n_kv_heads = NKV;
    m.ffn = 2 * m.hidden;
    m.tie_embeddings = tied;
    return m;
  }
};

// What one run of the parallel model leaves behind.
struct ModelRun {
  std::vector<double> losses;                                  // per rank
  ref::ModelWeights<float> grads;                              // one replica's share each
  std::vector<std::vector<std::vector<float>>> replica_grads;  // per rank, per parameter
  std::vector<TrafficCounters> forward, backward;              // per rank
  std::vector<ArenaStats> arena;                               // per rank, after backward
};

std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> batch_ids(const MeshModelCase& mc) {
  const std::size_t n = static_cast<std::size_t>(mc.B) * mc.S;
  std::vector<std::int32_t> tokens(n), targets(n);
  std::mt19937 gen(5);
  const auto V = static_cast<unsigned>(mc.model().vocab);
  for (std::size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<std::int32_t>(gen() % V);
    targets[i] = static_cast<std::int32_t>(gen() % V);
  }
  return {tokens, targets};
}

LayerProblem problem_of(const MeshModelCase& mc) {
  return {.model = mc.model(), .B = mc.B, .S = mc.S, .tsp = {}};
}

ModelRun run_model(const MeshModelCase& mc, const ref::ModelWeights<float>& w) {
  const auto ids = batch_ids(mc);
  const std::vector<std::int32_t>& tokens = ids.first;
  const std::vector<std::int32_t>& targets = ids.second;
  const StrategyBlocks& info = strategy_blocks(mc.st.scheme);
  const LayerProblem problem = problem_of(mc);
  const int n = mc.st.ranks();
  ModelRun r;
  r.losses.resize(static_cast<std::size_t>(n));
  r.grads = ref::ModelWeights<float>::zeros(mc.model());
  r.replica_grads.resize(static_cast<std::size_t>(n));
  r.forward.resize(static_cast<std::size_t>(n));
  r.backward.resize(static_cast<std::size_t>(n));
  r.arena.resize(static_cast<std::size_t>(n));
  World world({.ranks = n});
  world.run([&](Rank& rank) {
    const auto p = static_cast<std::size_t>(rank.id());
    const auto model = info.make_model(rank, problem, mc.st, w);
    rank.arena().reset_peaks();
    rank.counters().clear();
    r.losses[p] = model->forward(tokens, targets);
    r.forward[p] = rank.counters();
    rank.counters().clear();
    model->backward();
    r.backward[p] = rank.counters();
    r.arena[p] = rank.arena().stats();
    model->write_gradients(r.grads);
    for (const ParameterShard& s : model->parameters())
      r.replica_grads[p].emplace_back(s.grad.begin(), s.grad.end());
  });
  return r;
}

// The ranks holding the same parameters: the same column of the mesh (TSP: none).
bool replicas(const cost::Strategy& st, int a, int b) {
  if (st.scheme == cost::Scheme::tsp) return a == b;
  return a % st.T == b % st.T;
}

void check_mesh_model_case(const MeshModelCase& mc) {
  SCOPED_TRACE(mc.name());
  const ref::ModelConfig m = mc.model();
  auto w32 = ref::convert_weights<float>(ref::init_weights<double>(m, 11));
  const auto ids = batch_ids(mc);
  const std::vector<std::int32_t>& tokens = ids.first;
  const std::vector<std::int32_t>& targets = ids.second;
  const ModelRun r = run_model(mc, w32);
  const int n = mc.st.ranks();
  for (double l : r.losses) EXPECT_EQ(l, r.losses[0]) << "every rank reports the same loss";
  // Every strategy only reorders sums (vocabulary-parallel statistics and the blocks'
  // reductions), so its error is of the reference's own order: the blocks' factor.
  expect_model_passes_oracle_rule(r.losses[0], r.grads, w32, mc.B, mc.S, tokens, targets,
                                  kOracleFactor);
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      if (replicas(mc.st, a, b)) {
        EXPECT_EQ(r.replica_grads[static_cast<std::size_t>(a)],
                  r.replica_grads[static_cast<std::size_t>(b)])
            << "ranks " << a << " and " << b << " hold the same parameters";
      }

  // Traffic: L × the layer + the embedding/LM head/loss part, on every rank, both passes.
  const cost::ModelShape ms = cost::ModelShape::from(m, mc.B, mc.S);
  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  for (int p = 0; p < n; ++p) {
    const cost::LayerTraffic lt = cost::layer_traffic(ms, mc.st, es, {}, p);
    const cost::VocabTraffic vt = cost::vocab_traffic(ms, mc.st, es, p);
    const auto i = static_cast<std::size_t>(p);
    const auto L = static_cast<std::uint64_t>(mc.L);
    EXPECT_EQ(r.forward[i], lt.forward * L + vt.forward) << "rank " << p << " forward";
    EXPECT_EQ(r.backward[i], lt.backward * L + vt.backward) << "rank " << p << " backward";
  }

  // Memory: weights and gradients by category, L × one dry layer + the model's own tensors.
  const RankLayerMeasure layer = measure_layer(m, mc.B, mc.S, mc.st, {}).ranks[0];
  auto charged = [](std::uint64_t bytes) { return (bytes + 63) / 64 * 64; };
  const std::uint64_t shard =
      static_cast<std::uint64_t>(m.vocab / cost::vocab_shards(mc.st)) * m.hidden * 4;
  const std::uint64_t own = (m.tie_embeddings ? 1 : 2) * charged(shard) +
                            charged(static_cast<std::uint64_t>(m.hidden) * 4);
  const auto L = static_cast<std::uint64_t>(mc.L);
  const auto W = static_cast<std::size_t>(Category::weights);
  const auto G = static_cast<std::size_t>(Category::gradients);
  for (int p = 0; p < n; ++p) {
    const ArenaStats& a = r.arena[static_cast<std::size_t>(p)];
    EXPECT_EQ(a.category_peak[W], L * layer.resident[W] + own) << "rank " << p << " weights";
    EXPECT_EQ(a.category_peak[G], L * layer.backward.category_current[G] + own)
        << "rank " << p << " gradients";
  }
}

std::vector<cost::Strategy> strategies_at_2_and_4() {
  std::vector<cost::Strategy> v;
  for (int n : {2, 4}) {
    v.push_back(cost::Strategy::tp(n));
    v.push_back(cost::Strategy::megatron_sp(n));
    v.push_back(cost::Strategy::sp(n));
    v.push_back(cost::Strategy::ulysses(n));
    v.push_back(cost::Strategy::ring(n));
  }
  v.push_back(cost::Strategy::tp_sp(2, 2));
  v.push_back(cost::Strategy::tp_sp(2, 1));
  v.push_back(cost::Strategy::tp_sp(1, 2));
  return v;
}

TEST(MeshModel, LossAndEveryGradientPassTheOracleRuleWithTrafficAndMemoryAsModelled) {
  for (const cost::Strategy& st : strategies_at_2_and_4())
    for (bool tied : {false, true}) {
      MeshModelCase mc{.st = st, .tied = tied};  // GQA: 8 query heads, 4 KV heads
      check_mesh_model_case(mc);
    }
}

TEST(MeshModel, PassesWithABatchOfTwoAndGroupedQueryAttentionOfFour) {
  for (const cost::Strategy& st : {cost::Strategy::tp(2), cost::Strategy::megatron_sp(2),
                                   cost::Strategy::tp_sp(2, 2), cost::Strategy::ring(4)}) {
    MeshModelCase mc{.st = st, .NH = 8, .NKV = 2, .B = 2, .S = 16, .L = 1};
    check_mesh_model_case(mc);
  }
}

TEST(MeshModel, TspBehindTheCommonInterfacePassesTheSameChecks) {
  for (bool tied : {false, true})
    check_mesh_model_case({.st = cost::Strategy::tsp(4), .tied = tied});
}

TEST(MeshModel, RejectsAVocabularyNotDivisibleByTNamingTheValues) {
  MeshModelCase mc{.st = cost::Strategy::tp(4)};
  ref::ModelConfig m = mc.model();
  m.vocab = 50;
  auto w = ref::convert_weights<float>(ref::init_weights<double>(m, 1));
  World world({.ranks = 4});
  try {
    world.run([&](Rank& rank) {
      strategy_blocks(mc.st.scheme)
          .make_model(rank, {.model = m, .B = 1, .S = 16, .tsp = {}}, mc.st, w);
    });
    FAIL() << "expected a rejection";
  } catch (const tspemu::RankFailure& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("T=4 does not divide vocab=50"));
  }
  EXPECT_NO_THROW(BaselineShape::sp(m, 4, 1, 16).validate_whole_model())
      << "SP replicates the vocabulary";
}

TEST(MeshModel, RejectsATokenOutsideTheVocabularyNamingRankAndId) {
  MeshModelCase mc{.st = cost::Strategy::tp_sp(2, 2), .L = 1};
  const ref::ModelConfig m = mc.model();
  auto w = ref::convert_weights<float>(ref::init_weights<double>(m, 1));
  std::vector<std::int32_t> tokens, targets;
  std::tie(tokens, targets) = batch_ids(mc);
  tokens[5] = m.vocab;
  World world({.ranks = 4});
  try {
    world.run([&](Rank& rank) {
      const auto model = strategy_blocks(mc.st.scheme).make_model(rank, problem_of(mc), mc.st, w);
      model->forward(tokens, targets);
    });
    FAIL() << "expected a rejection";
  } catch (const tspemu::RankFailure& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("token 48"));
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("outside [0, vocab=48)"));
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("rank "));
  }
}

}  // namespace
}  // namespace tspemu::tsp::testing
