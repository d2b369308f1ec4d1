// Every configuration the baselines reject, with the message naming the strategy and the values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_attention.hpp"
#include "tspemu/tsp/baseline_mlp.hpp"
#include "tspemu/tsp/baseline_shape.hpp"

namespace tspemu::tsp {
namespace {

using ::testing::HasSubstr;

ref::ModelConfig model() {
  return {.vocab = 32, .hidden = 64, .n_layers = 1, .n_heads = 8, .n_kv_heads = 4, .ffn = 96};
}

void expect_baseline_rejected(const BaselineShape& s, const std::string& message) {
  try {
    s.validate();
    FAIL() << "expected rejection containing: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr(message));
  }
}

TEST(BaselineConfig, AcceptsValidShapesOfEveryStrategy) {
  EXPECT_NO_THROW(BaselineShape::tp(model(), 4, 1, 30).validate());
  EXPECT_NO_THROW(BaselineShape::megatron_sp(model(), 4, 1, 32).validate());
  EXPECT_NO_THROW(BaselineShape::sp(model(), 3, 2, 36).validate());
  EXPECT_NO_THROW(BaselineShape::tp_sp(model(), 2, 3, 1, 36).validate());
}

TEST(BaselineConfig, NamesTheStrategy) {
  EXPECT_EQ("TP", BaselineShape::tp(model(), 4, 1, 32).strategy());
  EXPECT_EQ("TP+Megatron-SP", BaselineShape::megatron_sp(model(), 4, 1, 32).strategy());
  EXPECT_EQ("SP", BaselineShape::sp(model(), 4, 1, 32).strategy());
  EXPECT_EQ("TP+SP", BaselineShape::tp_sp(model(), 2, 2, 1, 32).strategy());
}

TEST(BaselineConfig, TpRejectsQueryHeadsNotDivisibleByT) {
  auto m = model();
  m.n_kv_heads = 8;
  expect_baseline_rejected(BaselineShape::tp(m, 3, 1, 24),
                           "TP config: T=3 does not divide n_heads=8");
}

TEST(BaselineConfig, TpRejectsKvHeadsNotDivisibleByT) {
  expect_baseline_rejected(BaselineShape::tp(model(), 8, 1, 32),
                           "TP config: T=8 does not divide n_kv_heads=4");
}

TEST(BaselineConfig, TpRejectsMlpWidthNotDivisibleByT) {
  auto m = model();
  m.ffn = 98;
  expect_baseline_rejected(BaselineShape::tp(m, 4, 1, 32),
                           "TP config: T=4 does not divide the MLP width ffn=98");
}

TEST(BaselineConfig, MegatronSpRejectsSequenceNotDivisibleByT) {
  expect_baseline_rejected(
      BaselineShape::megatron_sp(model(), 4, 1, 30),
      "TP+Megatron-SP config: sequence parallelism needs S/Sp=30 tokens per row "
      "divisible by T=4");
}

TEST(BaselineConfig, SpRejectsSequenceNotDivisibleByTwoSp) {
  expect_baseline_rejected(BaselineShape::sp(model(), 3, 1, 27),
                           "SP config: zigzag layout needs S=27 divisible by 2·Sp=6");
}

TEST(BaselineConfig, TpSpRejectsHeadsAndSequence) {
  expect_baseline_rejected(BaselineShape::tp_sp(model(), 3, 2, 1, 24),
                           "TP+SP config: T=3 does not divide n_heads=8");
  expect_baseline_rejected(BaselineShape::tp_sp(model(), 2, 3, 1, 27),
                           "TP+SP config: zigzag layout needs S=27 divisible by 2·Sp=6");
}

TEST(BaselineConfig, RejectsDegreesBatchAndSequenceBelowOne) {
  expect_baseline_rejected(BaselineShape::tp_sp(model(), 0, 2, 1, 32), "T=0 must be >= 1");
  expect_baseline_rejected(BaselineShape::tp_sp(model(), 2, 0, 1, 32), "Sp=0 must be >= 1");
  expect_baseline_rejected(BaselineShape::tp(model(), 2, 0, 32), "B=0 must be >= 1");
  expect_baseline_rejected(BaselineShape::tp(model(), 2, 1, 0), "S=0 must be >= 1");
}

TEST(BaselineConfig, RejectsAnInvalidModel) {
  auto m = model();
  m.n_kv_heads = 3;  // does not divide n_heads
  EXPECT_THROW(BaselineShape::tp(m, 1, 1, 32).validate(), std::invalid_argument);
}

TEST(BaselineConfig, BlocksRejectAWorldOfTheWrongSize) {
  const auto s = BaselineShape::tp_sp(model(), 2, 2, 1, 32);
  auto w = ref::convert_weights<float>(ref::init_weights<double>(s.model, 1));
  World world({.ranks = 2});
  try {
    world.run([&](Rank& rank) { BaselineAttention att(rank, s, w.layers[0]); });
    FAIL() << "expected a rejection";
  } catch (const std::exception& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("world has 2 ranks but T·Sp=2·2"));
  }
  try {
    world.run([&](Rank& rank) { BaselineMlp mlp(rank, s, w.layers[0]); });
    FAIL() << "expected a rejection";
  } catch (const std::exception& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("world has 2 ranks but T·Sp=2·2"));
  }
}

}  // namespace
}  // namespace tspemu::tsp
