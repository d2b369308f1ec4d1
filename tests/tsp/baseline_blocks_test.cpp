// TP, TP + Megatron-SP, SP and TP+SP attention and MLP blocks through the check kit
// (strategy_checks.hpp): outputs and every gradient pass the fp64-oracle rule
// err(parallel fp32) <= k · err(reference fp32) + tiny  with k = 3, replicas (the ranks of a TP
// row for y and dx, of an SP column for the weight shard, every rank for the norm weight) agree
// bitwise, a 1 × 1 mesh is bitwise equal to the reference, and results are bitwise identical
// under seeded injection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

#include "strategy_checks.hpp"

namespace tspemu::tsp::testing {
namespace {

// Heads divisible by every T used: NH = 2·max(T, 2), NKV = NH (MHA) or NH/2 (GQA, g = 2).
BaselineCase make_case(Block b, int T, int Sp, bool msp, bool gqa, int B, int chunks) {
  BaselineCase c;
  c.block = b;
  c.T = T;
  c.Sp = Sp;
  c.sequence_parallel = msp;
  c.NH = 2 * std::max(T, 2);
  c.NKV = gqa ? c.NH / 2 : c.NH;
  c.B = B;
  c.S = 2 * T * Sp * chunks;  // S = 2·D·chunks: zigzag over Sp and Megatron pieces over T fit
  return c;
}

std::vector<BaselineCase> baseline_matrix(const std::vector<std::pair<int, int>>& meshes,
                                          bool msp) {
  std::vector<BaselineCase> cases;
  for (Block b : {Block::attention, Block::mlp})
    for (auto [T, Sp] : meshes)
      for (bool gqa : {false, true})
        for (int B : {1, 2})
          for (int chunks : {1, 3}) cases.push_back(make_case(b, T, Sp, msp, gqa, B, chunks));
  return cases;
}

std::string baseline_case_name(const ::testing::TestParamInfo<BaselineCase>& info) {
  std::string n = info.param.name();
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

class BaselineVsReference : public ::testing::TestWithParam<BaselineCase> {};

TEST_P(BaselineVsReference, OutputAndGradientsPassTheOracleRuleAndReplicasAgree) {
  const check::Report r = check_baseline(GetParam());
  EXPECT_TRUE(r.ok()) << printed(r);
  EXPECT_EQ(r.tensors.size(), GetParam().block == Block::attention ? 7u : 6u);
}

INSTANTIATE_TEST_SUITE_P(Tp, BaselineVsReference,
                         ::testing::ValuesIn(baseline_matrix({{1, 1}, {2, 1}, {3, 1}, {4, 1}},
                                                             false)),
                         baseline_case_name);
INSTANTIATE_TEST_SUITE_P(Sp, BaselineVsReference,
                         ::testing::ValuesIn(baseline_matrix({{1, 2}, {1, 3}, {1, 4}}, false)),
                         baseline_case_name);
// Every factorization of 4 and 6 ranks (T × Sp), and 8 = 2 × 4.
INSTANTIATE_TEST_SUITE_P(TpSp, BaselineVsReference,
                         ::testing::ValuesIn(baseline_matrix(
                             {{1, 4}, {2, 2}, {4, 1}, {1, 6}, {2, 3}, {3, 2}, {6, 1}, {2, 4}},
                             false)),
                         baseline_case_name);
INSTANTIATE_TEST_SUITE_P(MegatronSp, BaselineVsReference,
                         ::testing::ValuesIn(baseline_matrix({{1, 1}, {2, 1}, {3, 1}, {4, 1}},
                                                             true)),
                         baseline_case_name);
// Megatron-SP inside the rows of a TP+SP mesh composes too.
INSTANTIATE_TEST_SUITE_P(MegatronSpOnMesh, BaselineVsReference,
                         ::testing::ValuesIn(baseline_matrix({{2, 2}, {3, 2}}, true)),
                         baseline_case_name);

// Wider heads, g = 4 and longer sequences, one case per strategy and block.
std::vector<BaselineCase> larger_cases() {
  struct Mesh {
    int T, Sp;
    bool msp;
  };
  std::vector<BaselineCase> cases;
  for (Block b : {Block::attention, Block::mlp})
    for (Mesh m : {Mesh{4, 1, false}, Mesh{4, 1, true}, Mesh{1, 4, false}, Mesh{2, 2, false}}) {
      BaselineCase c = make_case(b, m.T, m.Sp, m.msp, /*gqa=*/true, /*B=*/2, /*chunks=*/12);
      c.NH = 8;
      c.NKV = 2 * std::max(1, m.T / 2);  // g = 4 (T <= 2) or 2 (T = 4)
      c.hs = 16;
      cases.push_back(c);
    }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Larger, BaselineVsReference, ::testing::ValuesIn(larger_cases()),
                         baseline_case_name);

}  // namespace
}  // namespace tspemu::tsp::testing

namespace tspemu::tsp::testing {
namespace {

// On a 1 × 1 mesh a baseline block makes the reference's kernel calls in the reference's order
// (no collective runs, o_proj/down_proj accumulate onto the residual), so it is bitwise equal.
TEST(BaselineBlocks, OneByOneMeshIsBitwiseEqualToTheReference) {
  for (Block b : {Block::attention, Block::mlp})
    for (bool msp : {false, true}) {
      BaselineCase c = make_case(b, 1, 1, msp, /*gqa=*/true, /*B=*/2, /*chunks=*/16);
      c.hs = 16;
      std::vector<std::string> differ;
      const check::Report r = check_baseline(c, [&](const RankBlockResult& rr) {
        differ = bitwise_differences_from_reference(rr, b, c.shape().shard_shape());
      });
      EXPECT_TRUE(r.ok()) << printed(r);
      EXPECT_TRUE(differ.empty()) << c.name() << ": " << ::testing::PrintToString(differ);
    }
}

}  // namespace
}  // namespace tspemu::tsp::testing

namespace tspemu::tsp::testing {
namespace {

// Seeded injection (injection.hpp) on every baseline scheme, including the 2 x 3 mesh whose row
// and column sub-groups run collectives concurrently: bitwise the same under every seed.
TEST(BaselineBlocks, BitwiseIdenticalUnderSeededInjection) {
  struct Mesh {
    int T, Sp;
    bool msp;
  };
  for (Mesh m : {Mesh{3, 1, false}, Mesh{3, 1, true}, Mesh{1, 3, false}, Mesh{2, 3, false}})
    for (Block b : {Block::attention, Block::mlp}) {
      const BaselineCase c = make_case(b, m.T, m.Sp, m.msp, /*gqa=*/true, /*B=*/2, /*chunks=*/2);
      const check::Report r = check_baseline(c, {}, /*inject_seeds=*/8);
      EXPECT_EQ(r.inject_seeds, 8);
      EXPECT_TRUE(r.nondeterminism.empty()) << printed(r);
      EXPECT_TRUE(r.ok()) << printed(r);
    }
}

}  // namespace
}  // namespace tspemu::tsp::testing
