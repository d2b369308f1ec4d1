// TP, TP + Megatron-SP, SP and TP+SP attention and MLP blocks against the dense reference:
// outputs and every gradient pass the fp64-oracle rule  err(parallel fp32) <= k · err(reference
// fp32) + tiny  with k = 3, replicas agree bitwise, and reruns are bitwise identical.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "baseline_harness.hpp"

namespace tspemu::tsp::testing {
namespace {

// The baselines only reorder sums (partial o_proj / down_proj per head or column shard, dN and
// K/V-gradient and weight-gradient reductions across ranks), as TSP does: same factor as TSP.
constexpr double kOracleFactor = 3.0;

World& world_of(int ranks) {  // one world per size, kept for the whole program
  static std::map<int, std::unique_ptr<World>> worlds;
  auto& w = worlds[ranks];
  if (!w) w = std::make_unique<World>(WorldOptions{.ranks = ranks});
  return *w;
}

void expect_close_to_oracle(const BaselineCase& c, const BaselineOutcome& o) {
  const auto cand = tensors(o.parallel, c.block);
  const auto ref32 = tensors(o.reference, c.block);
  const auto oracle = tensors(o.oracle, c.block);
  for (std::size_t i = 0; i < cand.size(); ++i) {
    auto v = ref::check_close(cand[i].first, *cand[i].second, *ref32[i].second, *oracle[i].second,
                              kOracleFactor);
    EXPECT_TRUE(v) << c.name() << ": " << v.report;
  }
  for (const auto& m : o.replicas.what) ADD_FAILURE() << c.name() << ": " << m;
}

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

std::vector<BaselineCase> matrix(const std::vector<std::pair<int, int>>& meshes, bool msp) {
  std::vector<BaselineCase> cases;
  for (Block b : {Block::attention, Block::mlp})
    for (auto [T, Sp] : meshes)
      for (bool gqa : {false, true})
        for (int B : {1, 2})
          for (int chunks : {1, 3}) cases.push_back(make_case(b, T, Sp, msp, gqa, B, chunks));
  return cases;
}

std::string test_name(const ::testing::TestParamInfo<BaselineCase>& info) {
  std::string n = info.param.name();
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

class BaselineVsReference : public ::testing::TestWithParam<BaselineCase> {};

TEST_P(BaselineVsReference, OutputAndGradientsPassTheOracleRule) {
  const BaselineCase c = GetParam();
  expect_close_to_oracle(c, run_baseline_case(c, world_of(c.T * c.Sp)));
}

INSTANTIATE_TEST_SUITE_P(Tp, BaselineVsReference,
                         ::testing::ValuesIn(matrix({{1, 1}, {2, 1}, {3, 1}, {4, 1}}, false)),
                         test_name);
INSTANTIATE_TEST_SUITE_P(Sp, BaselineVsReference,
                         ::testing::ValuesIn(matrix({{1, 2}, {1, 3}, {1, 4}}, false)), test_name);
// Every factorization of 4 and 6 ranks (T × Sp), and 8 = 2 × 4.
INSTANTIATE_TEST_SUITE_P(
    TpSp, BaselineVsReference,
    ::testing::ValuesIn(matrix({{1, 4}, {2, 2}, {4, 1}, {1, 6}, {2, 3}, {3, 2}, {6, 1}, {2, 4}},
                               false)),
    test_name);
INSTANTIATE_TEST_SUITE_P(MegatronSp, BaselineVsReference,
                         ::testing::ValuesIn(matrix({{1, 1}, {2, 1}, {3, 1}, {4, 1}}, true)),
                         test_name);
// Megatron-SP inside the rows of a TP+SP mesh composes too.
INSTANTIATE_TEST_SUITE_P(MegatronSpOnMesh, BaselineVsReference,
                         ::testing::ValuesIn(matrix({{2, 2}, {3, 2}}, true)), test_name);

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
                         test_name);

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
      const BaselineOutcome o = run_baseline_case(c, world_of(1));
      const auto t = tensors(o.parallel, b), r = tensors(o.reference, b);
      for (std::size_t i = 0; i < t.size(); ++i)
        EXPECT_EQ(*t[i].second, *r[i].second) << c.name() << ": " << t[i].first;
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
      const BaselineShape s = c.shape();
      auto w = ref::convert_weights<float>(ref::init_weights<double>(s.model, c.seed));
      const std::size_t n = static_cast<std::size_t>(c.B) * c.S * s.model.hidden;
      auto x = random_tensor<float>(n, 1), dy = random_tensor<float>(n, 2);
      World& world = world_of(s.ranks());
      EXPECT_NO_THROW(check_deterministic(world, {.seed = 100, .probability = 0.5}, 8, [&] {
        return result_bytes(run_baseline(c, world, w.layers[0], x, dy), b);
      })) << c.name();
    }
}

}  // namespace
}  // namespace tspemu::tsp::testing
