// The optimizer's update rules against their closed forms (torch.optim.AdamW / SGD semantics),
// in float and double, and the whole-model step's choice of which tensors decay.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/optimizer.hpp"

namespace tspemu::ref::testing {
namespace {

// Two AdamW steps of one element, written out from the torch.optim.AdamW documentation in double.
double adamw_two_steps(double w, double g1, double g2, const OptimizerConfig& c) {
  double m = 0, v = 0;
  const double gs[2] = {g1, g2};
  for (int t = 1; t <= 2; ++t) {
    const double g = gs[t - 1];
    w -= c.lr * c.weight_decay * w;
    m = c.beta1 * m + (1 - c.beta1) * g;
    v = c.beta2 * v + (1 - c.beta2) * g * g;
    const double mhat = m / (1 - std::pow(c.beta1, t)), vhat = v / (1 - std::pow(c.beta2, t));
    w -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
  }
  return w;
}

TEST(Optimizer, AdamwMatchesTheTorchFormulaOverTwoSteps) {
  OptimizerConfig c{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  std::vector<double> w{0.5, -1.25, 2.0, 0.0}, m(4), v(4);
  const std::vector<double> g1{0.3, -2.0, 1e-4, 0.7}, g2{-0.1, -1.0, 5e-3, 0.0};
  std::vector<double> want(4);
  for (std::size_t i = 0; i < 4; ++i) want[i] = adamw_two_steps(w[i], g1[i], g2[i], c);
  adamw_update<double>(w, g1, m, v, c, true, 1);
  adamw_update<double>(w, g2, m, v, c, true, 2);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(w[i], want[i], 1e-15) << "element " << i;
}

TEST(Optimizer, AdamwFirstStepMovesEachWeightByLrTimesTheGradientSign) {
  // Step 1: m̂ = g, v̂ = g², so the step is lr·g/(|g| + eps) — lr·sign(g) for |g| >> eps.
  const OptimizerConfig c{.lr = 1e-3};
  std::vector<float> w{1.f, 1.f, 1.f}, m(3), v(3);
  const std::vector<float> g{4.f, -0.5f, 0.f};
  adamw_update<float>(w, g, m, v, c, false, 1);
  EXPECT_NEAR(w[0], 1.f - 1e-3f, 1e-7f);
  EXPECT_NEAR(w[1], 1.f + 1e-3f, 1e-7f);
  EXPECT_EQ(w[2], 1.f) << "a zero gradient does not move the weight";
}

TEST(Optimizer, SgdIsWeightMinusLrTimesGradientWithDecoupledDecay) {
  const OptimizerConfig c{.kind = OptimizerKind::sgd, .lr = 0.5, .weight_decay = 0.5};
  std::vector<double> w{2.0, -4.0};
  sgd_update<double>(w, std::vector<double>{1.0, 2.0}, c, true);
  EXPECT_EQ(w[0], 2.0 * 0.75 - 0.5);
  EXPECT_EQ(w[1], -4.0 * 0.75 - 1.0);
  sgd_update<double>(w, std::vector<double>{0.0, 0.0}, c, false);
  EXPECT_EQ(w[0], 1.0) << "no decay when the tensor does not decay";
}

TEST(Optimizer, WholeModelStepDecaysMatricesButNotNormWeights) {
  const ModelConfig cfg = tiny_gqa_config();
  auto w = init_weights<double>(cfg, 3);
  const auto before = w;
  const auto zero = ModelWeights<double>::zeros(cfg);
  Optimizer<double> opt({.kind = OptimizerKind::sgd, .lr = 0.1, .weight_decay = 0.5});
  opt.step(w, zero);
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_EQ(w.final_norm, before.final_norm);
  EXPECT_EQ(w.layers[1].post_norm, before.layers[1].post_norm);
  EXPECT_EQ(w.layers[0].input_norm, before.layers[0].input_norm);
  EXPECT_EQ(w.embed[7], before.embed[7] * 0.95);
  EXPECT_EQ(w.layers[1].w_down[3], before.layers[1].w_down[3] * 0.95);
  std::vector<LayerWeights<double>> layers = before.layers;
  Optimizer<double> stack_opt({.kind = OptimizerKind::sgd, .lr = 0.1, .weight_decay = 0.5});
  stack_opt.step(layers, zero.layers);
  for (std::size_t l = 0; l < layers.size(); ++l)
    for (std::size_t i = 0; i < 9; ++i)
      EXPECT_EQ(*layers[l].named()[i].second, *w.layers[l].named()[i].second)
          << "the layer-stack step treats layer " << l << " tensor " << layers[l].named()[i].first
          << " as the model step does";
}

TEST(Optimizer, AdamwStateIsPerTensorAndStartsAtZero) {
  // Two tensors with the same gradient history move identically, whatever their order.
  Optimizer<float> opt({.lr = 0.01});
  std::vector<float> a{1.f, 2.f}, b{1.f, 2.f};
  const std::vector<float> g{0.5f, -0.25f};
  for (int s = 0; s < 3; ++s) {
    opt.begin_step();
    opt.update(1, b, g, true);
    opt.update(0, a, g, true);
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a[0], 1.f);
}

TEST(Optimizer, RejectsABadConfigNamingTheField) {
  EXPECT_THAT([] { Optimizer<float>({.lr = -1}); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("lr=-1")));
  EXPECT_THAT([] { Optimizer<float>({.beta2 = 1.0}); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("beta2=1")));
  EXPECT_THAT([] { optimizer_kind_named("adam"); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  ::testing::HasSubstr("unknown optimizer 'adam' (known: adamw, sgd)")));
  std::vector<float> w(3), g(2), m(3), v(3);
  EXPECT_THROW(adamw_update<float>(w, g, m, v, {}, true, 1), std::invalid_argument);
  EXPECT_THROW(adamw_update<float>(w, w, m, v, {}, true, 0), std::invalid_argument);
}

}  // namespace
}  // namespace tspemu::ref::testing
