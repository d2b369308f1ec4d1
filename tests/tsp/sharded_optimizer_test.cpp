// The sharded optimizer (sharded_optimizer.hpp) on TSP's whole model and on every strategy's
// layer stack: after each of several steps the parallel weights pass the fp64-oracle rule
// against the reference optimizer's trajectory, replicated norm weights stay bitwise equal on
// every rank, and the optimizer state per rank is what the planner's model says.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>

#include "oracle_factor.hpp"
#include "tspemu/plan/cost_model.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/optimizer.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/sharded_optimizer.hpp"
#include "tspemu/tsp/strategy.hpp"
#include "tspemu/tsp/tsp_model.hpp"

namespace tspemu::tsp::testing {
namespace {

// As for the blocks: the parallel step only reorders sums, and the update is the reference's own
// element-wise function, so its trajectory stays within the rule of the fp32 reference's:
// kOracleFactor (oracle_factor.hpp).
constexpr int kOptimizerSteps = 3;
// The planner's parameter state of tspemu's fp32 run: fp32 weights, gradients and AdamW moments
// (SGD: none), no master copy.
cost::ParameterState planned(const cost::Strategy& st, const cost::ModelShape& m,
                             const ref::OptimizerConfig& oc) {
  cost::PrecisionModel p = cost::PrecisionModel::fp32_emulator();
  p.moments = oc.state_per_param() * 4.0;
  return cost::parameter_state_bytes_per_rank(st, m, p);
}

const ref::OptimizerConfig kAdamw{.lr = 1e-2, .weight_decay = 0.1};
const ref::OptimizerConfig kSgd{.kind = ref::OptimizerKind::sgd, .lr = 0.5, .weight_decay = 0.1};
// The layer stack's linear loss <y, dy> is unbounded below: a small step keeps it finite.
const ref::OptimizerConfig kStackSgd{
    .kind = ref::OptimizerKind::sgd, .lr = 1e-3, .weight_decay = 0.1};

std::size_t category(const ArenaStats& s, Category c) {
  return s.category_current[static_cast<std::size_t>(c)];
}

// Every norm weight of each rank, concatenated, for the bitwise check across ranks.
std::vector<float> replicated(const std::vector<ParameterShard>& ps) {
  std::vector<float> out;
  for (const ParameterShard& p : ps)
    if (p.replicated) out.insert(out.end(), p.weight.begin(), p.weight.end());
  return out;
}

// Weights after AdamW updates are judged on the 99% quantile of the element errors (numerics.hpp,
// check_close_quantile: the update amplifies a gradient's rounding by up to lr/eps on the few
// elements with |g| ~ eps); after SGD, whose update is linear in the gradient, on the max.
ref::Verdict weights_rule(const ref::OptimizerConfig& oc, const std::string& name,
                          std::span<const float> got, std::span<const float> r32,
                          std::span<const double> o64) {
  return oc.kind == ref::OptimizerKind::adamw
             ? ref::check_close_quantile(name, got, r32, o64, kOracleFactor)
             : ref::check_close(name, got, r32, o64, kOracleFactor);
}

void expect_rule(const std::string& what, const ref::OptimizerConfig& oc,
                 const ref::ModelWeights<float>& got, const ref::ModelWeights<float>& r32,
                 const ref::ModelWeights<double>& o64) {
  const auto g = ref::parameters(got);
  const auto r = ref::parameters(r32);
  const auto o = ref::parameters(o64);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto v = weights_rule(oc, g[i].name, *g[i].data, *r[i].data, *o[i].data);
    EXPECT_TRUE(v) << what << ": " << v.report;
  }
}

void check_tsp_model(int D, bool tied, const ref::OptimizerConfig& oc) {
  TspShape s;
  s.model = {.vocab = 16 * D,
             .hidden = 32,
             .n_layers = 2,
             .n_heads = 8,
             .n_kv_heads = 4,
             .ffn = 96,
             .tie_embeddings = tied};
  s.D = D;
  s.B = 1;
  s.S = 8 * D;
  s.validate_whole_model();
  auto w32 = ref::convert_weights<float>(ref::init_weights<double>(s.model, 11));
  auto w64 = ref::convert_weights<double>(w32);
  const auto master = w32;
  const std::size_t n = static_cast<std::size_t>(s.S);
  std::vector<std::int32_t> tokens(n), targets(n);
  std::mt19937 gen(5);
  for (std::size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
    targets[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
  }
  const ref::Batch batch{1, s.S, tokens, targets, {}};
  ref::Optimizer<float> opt32(oc);
  ref::Optimizer<double> opt64(oc);

  World world({.ranks = D});
  std::vector<std::unique_ptr<TspModel>> models(static_cast<std::size_t>(D));
  std::vector<std::unique_ptr<ShardedOptimizer>> opts(static_cast<std::size_t>(D));
  std::vector<std::vector<float>> norms(static_cast<std::size_t>(D));
  std::vector<ArenaStats> stats(static_cast<std::size_t>(D));
  std::vector<double> losses(static_cast<std::size_t>(D));
  auto got = ref::ModelWeights<float>::zeros(s.model);
  const SequenceLayout layout = s.layout();
  for (int step = 1; step <= kOptimizerSteps; ++step) {
    world.run([&](Rank& rank) {
      const auto p = static_cast<std::size_t>(rank.id());
      std::vector<std::int32_t> tl(static_cast<std::size_t>(s.Tl())), yl(tl.size());
      layout.scatter(tokens.data(), tl.data(), rank.id(), 1, 1);
      layout.scatter(targets.data(), yl.data(), rank.id(), 1, 1);
      if (!models[p]) models[p] = std::make_unique<TspModel>(rank, s, master);
      losses[p] = models[p]->forward(tl.data(), yl.data());
      models[p]->backward();
      if (!opts[p]) opts[p] = std::make_unique<ShardedOptimizer>(rank, oc, models[p]->parameters());
      opts[p]->step();
      models[p]->write_weights(got);
      norms[p] = replicated(opts[p]->shards());
      stats[p] = rank.arena().stats();
    });
    ref::ModelCache<float> c32;
    ref::ModelCache<double> c64;
    auto g32 = ref::ModelWeights<float>::zeros(s.model);
    auto g64 = ref::ModelWeights<double>::zeros(s.model);
    const double loss32 = ref::model_forward(w32, batch, c32);
    const double loss64 = ref::model_forward(w64, batch, c64);
    ref::model_backward(w32, batch, c32, g32);
    ref::model_backward(w64, batch, c64, g64);
    opt32.step(w32, g32);
    opt64.step(w64, g64);
    const std::string what = "D=" + std::to_string(D) + (tied ? " tied " : " untied ") +
                             oc.to_string() + ", step " + std::to_string(step);
    const auto v = ref::check_close("loss", std::vector<float>{static_cast<float>(losses[0])},
                                    std::vector<float>{static_cast<float>(loss32)},
                                    std::vector<double>{loss64}, kOracleFactor);
    EXPECT_TRUE(v) << what << ": " << v.report;
    expect_rule(what, oc, got, w32, w64);
    for (int r = 1; r < D; ++r)
      EXPECT_EQ(norms[static_cast<std::size_t>(r)], norms[0])
          << what << ": rank " << r << "'s norm weights differ from rank 0's";
  }
  const cost::ParameterState plan =
      planned(cost::Strategy::tsp(D), cost::ModelShape::from(s.model, 1, s.S), oc);
  for (int r = 0; r < D; ++r) {
    const ArenaStats& st = stats[static_cast<std::size_t>(r)];
    EXPECT_EQ(category(st, Category::weights), plan.weights) << "rank " << r;
    EXPECT_EQ(category(st, Category::gradients), plan.gradients) << "rank " << r;
    EXPECT_EQ(category(st, Category::optimizer), plan.optimizer()) << "rank " << r;
    EXPECT_EQ(category(st, Category::optimizer),
              oc.kind == ref::OptimizerKind::adamw ? 2 * category(st, Category::weights) : 0)
        << "rank " << r;
  }
}

TEST(ShardedOptimizer, TspModelWeightsFollowTheReferenceAdamwTrajectory) {
  for (int D : {1, 2, 4})
    for (bool tied : {false, true}) check_tsp_model(D, tied, kAdamw);
}

TEST(ShardedOptimizer, TspModelWeightsFollowTheReferenceSgdTrajectory) {
  check_tsp_model(2, false, kSgd);
}

// The layer stack of every strategy at 4 ranks: loss <y, dy> with a fixed seeded dy, so each
// step's upstream gradient is dy.
void check_stack(const cost::Strategy& st, const ref::OptimizerConfig& oc) {
  ref::ModelConfig m{
      .vocab = 4, .hidden = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4, .ffn = 64};
  const int B = 1, S = 16, C = m.hidden;
  const StrategyBlocks& info = strategy_blocks(st.scheme);
  const LayerProblem problem{m, B, S, {}};
  auto init = ref::convert_weights<float>(ref::init_weights<double>(m, 3));
  std::vector<ref::LayerWeights<float>> w32 = init.layers;
  std::vector<ref::LayerWeights<double>> w64 = ref::convert_weights<double>(init).layers;
  std::vector<float> x(static_cast<std::size_t>(B) * S * C), dy(x.size());
  std::mt19937 gen(9);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(gen);
  for (auto& v : dy) v = nd(gen);
  const std::vector<double> x64(x.begin(), x.end()), dy64(dy.begin(), dy.end());
  ref::Optimizer<float> opt32(oc);
  ref::Optimizer<double> opt64(oc);
  const int n = st.ranks();
  World world({.ranks = n});
  struct RankState {
    RankPlacement place;
    std::vector<std::unique_ptr<RankLayer>> layers;
    std::unique_ptr<ShardedOptimizer> opt;
    std::vector<float> norms;
    ArenaStats stats;
  };
  std::vector<RankState> ranks(static_cast<std::size_t>(n));
  auto got = ref::ModelWeights<float>::zeros(m);
  for (int step = 1; step <= kOptimizerSteps; ++step) {
    world.run([&](Rank& rank) {
      RankState& rs = ranks[static_cast<std::size_t>(rank.id())];
      if (rs.layers.empty()) {
        rs.place = info.place(problem, st, rank.id());
        for (const auto& lw : init.layers)
          rs.layers.push_back(info.make_layer(rank, problem, st, lw));
      }
      const std::size_t rows = rs.place.positions.size();
      std::vector<std::vector<float>> act(static_cast<std::size_t>(m.n_layers) + 1,
                                          std::vector<float>(rows * C));
      std::vector<float> g(rows * C), g_next(rows * C);
      for (std::size_t i = 0; i < rows; ++i) {
        const auto gl = static_cast<std::size_t>(rs.place.positions[i]) * C;
        std::memcpy(act[0].data() + i * C, x.data() + gl, C * sizeof(float));
        std::memcpy(g.data() + i * C, dy.data() + gl, C * sizeof(float));
      }
      for (std::size_t l = 0; l < rs.layers.size(); ++l)
        rs.layers[l]->forward(act[l].data(), act[l + 1].data());
      for (std::size_t l = rs.layers.size(); l-- > 0;) {
        rs.layers[l]->backward(act[l].data(), g.data(), g_next.data());
        std::swap(g, g_next);
      }
      if (!rs.opt) {
        std::vector<ParameterShard> ps;
        for (auto& layer : rs.layers) {
          const auto lp = layer->parameters();
          ps.insert(ps.end(), lp.begin(), lp.end());
        }
        rs.opt = std::make_unique<ShardedOptimizer>(rank, oc, std::move(ps));
      }
      rs.opt->step();
      rs.norms = replicated(rs.opt->shards());
      rs.stats = rank.arena().stats();
      for (std::size_t l = 0; l < rs.layers.size(); ++l) {
        const auto ps = rs.layers[l]->parameters();
        if (rs.place.reports_shard) {
          unpack_attention_shard(ps[0].weight.data(), rs.place.shard_shape, rs.place.shard,
                                 got.layers[l]);
          unpack_mlp_shard(ps[2].weight.data(), rs.place.shard_shape, rs.place.shard,
                           got.layers[l]);
        }
        if (rank.id() == 0) {
          std::ranges::copy(ps[1].weight, got.layers[l].input_norm.begin());
          std::ranges::copy(ps[3].weight, got.layers[l].post_norm.begin());
        }
      }
    });
    auto step_ref = [&](auto& w, const auto& xin, const auto& dyin, auto& opt) {
      using T = std::decay_t<decltype(xin[0])>;
      std::vector<std::int64_t> pos(static_cast<std::size_t>(S));
      for (int i = 0; i < S; ++i) pos[static_cast<std::size_t>(i)] = i;
      std::vector<std::vector<T>> act(w.size() + 1, xin);
      std::vector<ref::LayerCache<T>> caches(w.size());
      for (std::size_t l = 0; l < w.size(); ++l)
        ref::layer_forward(m, w[l], act[l].data(), act[l + 1].data(), pos.data(), B, S, caches[l]);
      std::vector<T> d = dyin, dn(d.size());
      std::vector<ref::LayerWeights<T>> grads(w.size(), ref::LayerWeights<T>::zeros(m));
      for (std::size_t l = w.size(); l-- > 0;) {
        ref::layer_backward(m, w[l], act[l].data(), d.data(), dn.data(), pos.data(), B, S,
                            caches[l], grads[l]);
        std::swap(d, dn);
      }
      opt.step(w, grads);
    };
    step_ref(w32, x, dy, opt32);
    step_ref(w64, x64, dy64, opt64);
    const std::string what = st.name() + " " + oc.to_string() + ", step " + std::to_string(step);
    for (std::size_t l = 0; l < w32.size(); ++l)
      for (std::size_t i = 0; i < 9; ++i) {
        const auto v = weights_rule(
            oc, "layers." + std::to_string(l) + "." + got.layers[l].named()[i].first,
            *got.layers[l].named()[i].second, *w32[l].named()[i].second, *w64[l].named()[i].second);
        EXPECT_TRUE(v) << what << ": " << v.report;
      }
    for (int r = 1; r < n; ++r)
      EXPECT_EQ(ranks[static_cast<std::size_t>(r)].norms, ranks[0].norms)
          << what << ": rank " << r << "'s norm weights differ from rank 0's";
  }
  for (int r = 0; r < n; ++r) {
    const ArenaStats& s = ranks[static_cast<std::size_t>(r)].stats;
    const std::size_t want =
        oc.kind == ref::OptimizerKind::adamw ? 2 * category(s, Category::weights) : 0;
    EXPECT_EQ(category(s, Category::optimizer), want) << st.name() << " rank " << r;
    cost::ModelShape ms = cost::ModelShape::from(m, B, S);
    ms.vocab = 0;  // the layer stack
    const cost::ParameterState plan = planned(st, ms, oc);
    EXPECT_EQ(category(s, Category::weights), plan.weights) << st.name() << " rank " << r;
    EXPECT_EQ(category(s, Category::optimizer), plan.optimizer())
        << st.name() << " rank " << r << ": the planner's 8 B per parameter held";
  }
}

TEST(ShardedOptimizer, EveryStrategysLayerStackFollowsTheReferenceAdamwTrajectory) {
  for (const cost::Strategy& st : strategies_at(4)) {
    SCOPED_TRACE(st.name());
    check_stack(st, kAdamw);
  }
}

TEST(ShardedOptimizer, EveryStrategysLayerStackFollowsTheReferenceSgdTrajectory) {
  for (const cost::Strategy& st : strategies_at(4)) {
    SCOPED_TRACE(st.name());
    check_stack(st, kStackSgd);
  }
}

TEST(ShardedOptimizer, RejectsShardsWithoutGradientsNamingTheRankAndTensor) {
  World world({.ranks = 2});
  try {
    world.run([&](Rank& rank) {
      std::vector<float> w(4);
      ShardedOptimizer opt(rank, kAdamw, {{"attention", w, {}, false, true}});
    });
    FAIL() << "expected a rejection";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("attention has 4 weights but 0 gradients"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("rank "), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tspemu::tsp::testing
