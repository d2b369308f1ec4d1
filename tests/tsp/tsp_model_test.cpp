// The whole TSP model (vocab-sharded embedding and LM head, L TSP layers) against the dense
// reference model: the loss and every parameter gradient pass the fp64-oracle rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/tsp/tsp_model.hpp"

namespace tspemu::tsp::testing {
namespace {

constexpr double kOracleFactor = 3.0;  // as for the blocks: TSP only reorders sums

struct ModelCase {
  int D = 2, NH = 4, NKV = 2, B = 1, S = 16, L = 2;
  bool tied = false;
  std::string name() const {
    return "D=" + std::to_string(D) + " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV) +
           " B=" + std::to_string(B) + " S=" + std::to_string(S) + (tied ? " tied" : " untied");
  }
};

// Every gradient tensor of a model, by checkpoint name.
template <class T>
std::vector<std::pair<std::string, const std::vector<T>*>> all_tensors(
    const ref::ModelWeights<T>& g) {
  std::vector<std::pair<std::string, const std::vector<T>*>> out;
  for (const auto& p : ref::parameters(g)) out.emplace_back(p.name, p.data);
  return out;
}

void check_model(const ModelCase& mc) {
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
  auto w64 = ref::convert_weights<double>(w32);
  const std::size_t n = static_cast<std::size_t>(mc.B) * mc.S;
  std::vector<std::int32_t> tokens(n), targets(n);
  std::mt19937 gen(5);
  for (std::size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
    targets[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
  }
  ref::Batch batch{mc.B, mc.S, tokens, targets, {}};
  ref::ModelCache<double> c64;
  ref::ModelCache<float> c32;
  ref::ModelWeights<double> g64;
  ref::ModelWeights<float> g32;
  const double loss64 = ref::model_forward(w64, batch, c64);
  const double loss32 = ref::model_forward(w32, batch, c32);
  ref::model_backward(w64, batch, c64, g64);
  ref::model_backward(w32, batch, c32, g32);

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
  auto v = ref::check_close("loss", std::vector<float>{static_cast<float>(losses[0])},
                            std::vector<float>{static_cast<float>(loss32)},
                            std::vector<double>{loss64}, kOracleFactor);
  EXPECT_TRUE(v) << mc.name() << ": " << v.report;
  const auto cand = all_tensors(gt), r32 = all_tensors(g32);
  const auto o64 = all_tensors(g64);
  ASSERT_EQ(cand.size(), o64.size());
  for (std::size_t i = 0; i < cand.size(); ++i) {
    auto vi = ref::check_close(cand[i].first, *cand[i].second, *r32[i].second, *o64[i].second,
                               kOracleFactor);
    EXPECT_TRUE(vi) << mc.name() << ": " << vi.report;
  }
}

TEST(TspModel, LossAndEveryGradientPassTheOracleRule) {
  for (int D : {1, 2, 3, 4})
    for (bool tied : {false, true})
      for (int B : {1, 2}) {
        ModelCase mc;
        mc.D = D;
        mc.NH = 2 * D;
        mc.NKV = D;
        mc.B = B;
        mc.S = 4 * D;
        mc.tied = tied;
        SCOPED_TRACE(mc.name());
        check_model(mc);
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
