// TSP in double (BasicTspModel<double>: the same schedule, blocks and collectives on doubles)
// against the fp64 oracle: a far sharper check than the fp32 rule, since a schedule bug cannot
// hide in fp32 noise. Both sides compute in double and differ only in summation order, so every
// tensor agrees to ~1e-13 of its largest magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <random>

#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/optimizer.hpp"
#include "tspemu/tsp/tsp_model.hpp"

namespace tspemu::tsp::testing {
namespace {

// Relative to the tensor's largest magnitude (check_close64's rtol): reordered double sums of a
// few hundred terms differ by ~1e-15; 1e-12 leaves room for the softmax and the Adam steps.
constexpr double kRtol = 1e-12;

struct DoubleCase {
  int D = 2;
  bool tied = false;
  TspShape shape() const {
    TspShape s;
    s.model = {.vocab = 8 * D,
               .hidden = 16 * D,
               .n_layers = 2,
               .n_heads = 2 * D,
               .n_kv_heads = D,
               .ffn = 48 * D,
               .tie_embeddings = tied};
    s.D = D;
    s.B = 2;
    s.S = 8 * D;
    s.validate_whole_model();
    return s;
  }
};

struct Batch64 {
  std::vector<std::int32_t> tokens, targets;
};

Batch64 batch_of(const TspShape& s, unsigned seed) {
  const std::size_t n = static_cast<std::size_t>(s.B) * s.S;
  Batch64 b{std::vector<std::int32_t>(n), std::vector<std::int32_t>(n)};
  std::mt19937 gen(seed);
  for (std::size_t i = 0; i < n; ++i) {
    b.tokens[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
    b.targets[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
  }
  return b;
}

// Runs `steps` steps of TSP in double on D ranks and of the oracle; with steps > 0 each step
// ends with an AdamW update of every rank's shards. Checks the loss of every step, and either
// the gradients (steps == 0: one forward + backward) or the weights after every update. Returns
// the worst error relative to each tensor's largest magnitude.
double check_double(const DoubleCase& dc, int steps) {
  const TspShape s = dc.shape();
  auto w64 = ref::init_weights<double>(s.model, 21);
  const auto master = w64;
  const ref::OptimizerConfig oc{.lr = 1e-2, .weight_decay = 0.1};
  ref::Optimizer<double> opt(oc);
  World world({.ranks = dc.D});
  std::vector<std::unique_ptr<BasicTspModel<double>>> models(static_cast<std::size_t>(dc.D));
  struct State {
    std::vector<std::vector<double>> m, v;
  };
  std::vector<State> state(static_cast<std::size_t>(dc.D));
  auto got = ref::ModelWeights<double>::zeros(s.model);
  std::vector<double> losses(static_cast<std::size_t>(dc.D));
  const SequenceLayout layout = s.layout();
  double worst = 0;
  const int runs = std::max(steps, 1);
  for (int step = 1; step <= runs; ++step) {
    const Batch64 b = batch_of(s, static_cast<unsigned>(step));
    world.run([&](Rank& rank) {
      const auto p = static_cast<std::size_t>(rank.id());
      std::vector<std::int32_t> tl(static_cast<std::size_t>(s.B) * s.Tl()), yl(tl.size());
      layout.scatter(b.tokens.data(), tl.data(), rank.id(), s.B, 1);
      layout.scatter(b.targets.data(), yl.data(), rank.id(), s.B, 1);
      if (!models[p]) models[p] = std::make_unique<BasicTspModel<double>>(rank, s, master);
      losses[p] = models[p]->forward(tl.data(), yl.data());
      models[p]->backward();
      if (steps == 0) {
        models[p]->write_gradients(got);
        return;
      }
      const auto params = models[p]->parameters();
      State& st = state[p];
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (st.m.size() <= i) {
          st.m.emplace_back(params[i].weight.size());
          st.v.emplace_back(params[i].weight.size());
        }
        ref::adamw_update<double>(params[i].weight, params[i].grad, st.m[i], st.v[i], oc,
                                  params[i].decay, step);
      }
      models[p]->write_weights(got);
    });
    const ref::Batch batch{s.B, s.S, b.tokens, b.targets, {}};
    ref::ModelCache<double> cache;
    auto grads = ref::ModelWeights<double>::zeros(s.model);
    const double loss = ref::model_forward(w64, batch, cache);
    ref::model_backward(w64, batch, cache, grads);
    if (steps > 0) opt.step(w64, grads);
    const std::string what = "D=" + std::to_string(dc.D) + (dc.tied ? " tied" : " untied") +
                             " step " + std::to_string(step);
    for (double l : losses) EXPECT_EQ(l, losses[0]) << what << ": every rank's loss";
    const auto vl = ref::check_close64("loss", std::vector<double>{losses[0]},
                                       std::vector<double>{loss}, kRtol);
    EXPECT_TRUE(vl) << what << ": " << vl.report;
    const auto cand = ref::parameters(static_cast<const ref::ModelWeights<double>&>(got));
    const auto want =
        ref::parameters(static_cast<const ref::ModelWeights<double>&>(steps == 0 ? grads : w64));
    for (std::size_t i = 0; i < cand.size(); ++i) {
      const auto v = ref::check_close64(cand[i].name, *cand[i].data, *want[i].data, kRtol);
      EXPECT_TRUE(v) << what << ": " << v.report;
      if (v.candidate.oracle_max > 0)
        worst = std::max(worst, v.candidate.max_abs / v.candidate.oracle_max);
    }
  }
  return worst;
}

TEST(TspModelDouble, EveryGradientMatchesTheOracleTo1e12) {
  double worst = 0;
  for (int D : {1, 2, 3, 4})
    for (bool tied : {false, true}) worst = std::max(worst, check_double({D, tied}, 0));
  std::cout << "worst gradient error / max|oracle| over D = 1..4: " << worst << "\n";
  EXPECT_GT(worst, 0.0) << "the schedule reorders sums, so some rounding differs";
}

TEST(TspModelDouble, TenAdamwStepsFollowTheOracleTrajectoryTo1e12) {
  double worst = 0;
  for (int D : {2, 4}) worst = std::max(worst, check_double({D, false}, 10));
  std::cout << "worst weight error / max|oracle| over 10 AdamW steps: " << worst << "\n";
}

}  // namespace
}  // namespace tspemu::tsp::testing
