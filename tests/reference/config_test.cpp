// ModelConfig::validate: each requirement, with the field and value named in the error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include "test_util.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/model_config.hpp"

namespace tspemu::ref {
namespace {

void expect_rejected(const std::function<void(ModelConfig&)>& edit, const std::string& message) {
  ModelConfig c = testing::tiny_gqa_config();
  edit(c);
  try {
    c.validate();
    ADD_FAILURE() << "accepted: " << c.to_string();
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(message));
  }
}

TEST(ModelConfig, ValidTinyConfigsAreAccepted) {
  EXPECT_NO_THROW(testing::tiny_gqa_config().validate());
  EXPECT_NO_THROW(testing::tiny_tied_config().validate());
}

TEST(ModelConfig, RejectsNonPositiveSizesNamingTheField) {
  expect_rejected([](ModelConfig& c) { c.vocab = 0; }, "vocab=0 must be positive");
  expect_rejected([](ModelConfig& c) { c.hidden = -4; }, "hidden=-4 must be positive");
  expect_rejected([](ModelConfig& c) { c.n_layers = 0; }, "n_layers=0 must be positive");
  expect_rejected([](ModelConfig& c) { c.n_heads = 0; }, "n_heads=0 must be positive");
  expect_rejected([](ModelConfig& c) { c.n_kv_heads = 0; }, "n_kv_heads=0 must be positive");
  expect_rejected([](ModelConfig& c) { c.ffn = -1; }, "ffn=-1 must be positive");
}

TEST(ModelConfig, RejectsHeadsNotDividingHidden) {
  expect_rejected(
      [](ModelConfig& c) {
        c.hidden = 100;
        c.n_heads = 12;
        c.n_kv_heads = 12;
      },
      "n_heads=12 does not divide hidden=100");
}

TEST(ModelConfig, RejectsKvHeadsNotDividingHeads) {
  expect_rejected([](ModelConfig& c) { c.n_kv_heads = 3; },
                  "n_kv_heads=3 does not divide n_heads=4");
}

TEST(ModelConfig, RejectsOddHeadSizeBecauseRopeRotatesPairs) {
  expect_rejected(
      [](ModelConfig& c) {
        c.hidden = 12;
        c.n_heads = 4;
        c.n_kv_heads = 4;
      },
      "head size hidden/n_heads=3 must be even");
}

TEST(ModelConfig, RejectsNonPositiveOrNanRopeBaseAndEps) {
  expect_rejected([](ModelConfig& c) { c.rope_base = 0; }, "rope_base=0 must be positive");
  expect_rejected([](ModelConfig& c) { c.rope_base = std::nan(""); }, "rope_base=nan");
  expect_rejected([](ModelConfig& c) { c.norm_eps = -1e-6; }, "norm_eps=-1e-06 must be positive");
}

TEST(ModelConfig, RejectsInfiniteRopeBaseAndEps) {
  const double inf = std::numeric_limits<double>::infinity();
  expect_rejected([&](ModelConfig& c) { c.rope_base = inf; },
                  "rope_base=inf must be positive and finite");
  expect_rejected([&](ModelConfig& c) { c.rope_base = -inf; }, "rope_base=-inf");
  expect_rejected([&](ModelConfig& c) { c.norm_eps = inf; },
                  "norm_eps=inf must be positive and finite");
  expect_rejected([](ModelConfig& c) { c.norm_eps = std::nan(""); }, "norm_eps=nan");
  expect_rejected([](ModelConfig& c) { c.norm_eps = 0; }, "norm_eps=0 must be positive");
}

TEST(ModelConfig, WeightsCannotBeBuiltFromAnInvalidConfig) {
  ModelConfig c = testing::tiny_gqa_config();
  c.n_kv_heads = 3;
  EXPECT_THROW(ModelWeights<float>::zeros(c), std::invalid_argument);
}

}  // namespace
}  // namespace tspemu::ref
