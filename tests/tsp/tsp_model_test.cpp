// The whole TSP model (vocab-sharded embedding and LM head, L TSP layers) against the dense
// reference model: the loss and every parameter gradient pass the fp64-oracle rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "model_checks.hpp"
#include "oracle_factor.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/tsp/tsp_model.hpp"

namespace tspemu::tsp::testing {
namespace {

struct TspModelCase {
  int D = 2, NH = 4, NKV = 2, B = 1, S = 16, L = 2;
  bool tied = false;
  std::string name() const {
    return "D=" + std::to_string(D) + " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV) +
           " B=" + std::to_string(B) + " S=" + std::to_string(S) + (tied ? " tied" : " untied");
  }
};

void check_tsp_model_case(const TspModelCase& mc) {
  TspShape s;
  s.model.vocab = 8 * mc.D;
  s.model.hidden = mc.NH * 8;
  s.model.n_layers = mc.L;
  s.model.n_heads = mc.NH;
  s.model.n_kv_heads = mc.NKV;
  s.model.ffn = 3 * s.model.hidden;
  s.model.tie_embeddings = mc.tied;
  s.D = mc.D;
  s.B = mc.B;
  s.S = mc.S;
  s.validate();
  auto w32 = ref::convert_weights<float>(ref::init_weights<double>(s.model, 11));
  const std::size_t n = static_cast<std::size_t>(mc.B) * mc.S;
  std::vector<std::int32_t> tokens(n), targets(n);
  std::mt19937 gen(5);
  for (std::size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
    targets[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
  }

  auto gt = ref::ModelWeights<float>::zeros(s.model);
  std::vector<double> losses(static_cast<std::size_t>(mc.D));
  const SequenceLayout layout = s.layout();
  World world({.ranks = mc.D});
  world.run([&](Rank& rank) {
    const int p = rank.id();
    std::vector<std::int32_t> tl(static_cast<std::size_t>(mc.B) * s.Tl()), yl(tl.size());
    layout.scatter(tokens.data(), tl.data(), p, mc.B, 1);
    layout.scatter(targets.data(), yl.data(), p, mc.B, 1);
    TspModel model(rank, s, w32);
    losses[static_cast<std::size_t>(p)] = model.forward(tl.data(), yl.data());
    model.backward();
    model.write_gradients(gt);
  });
  for (double l : losses) EXPECT_EQ(l, losses[0]) << "every rank reports the same loss";
  expect_model_passes_oracle_rule(losses[0], gt, w32, mc.B, mc.S, tokens, targets, kOracleFactor);
}

TEST(TspModel, LossAndEveryGradientPassTheOracleRule) {
  for (int D : {1, 2, 3, 4})
    for (bool tied : {false, true})
      for (int B : {1, 2}) {
        TspModelCase mc;
        mc.D = D;
        mc.NH = 2 * D;
        mc.NKV = D;
        mc.B = B;
        mc.S = 4 * D;
        mc.tied = tied;
        SCOPED_TRACE(mc.name());
        check_tsp_model_case(mc);
      }
}

TEST(TspModel, RejectsAVocabularyNotDivisibleByD) {
  TspShape s;
  s.model = {.vocab = 10, .hidden = 16, .n_layers = 1, .n_heads = 4, .n_kv_heads = 4, .ffn = 24};
  s.D = 4;
  s.S = 16;
  auto w = ref::convert_weights<float>(ref::init_weights<double>(s.model, 1));
  World world({.ranks = 4});
  try {
    world.run([&](Rank& r) { TspModel m(r, s, w); });
    FAIL() << "expected a rejection";
  } catch (const tspemu::RankFailure& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("D=4 does not divide vocab=10"));
  }
}

}  // namespace
}  // namespace tspemu::tsp::testing
