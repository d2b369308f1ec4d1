// Reductions (sum): reduce_scatter, all_reduce, reduce; exact inputs, checked bit for bit.
#include <gtest/gtest.h>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

class ReduceTest : public ::testing::TestWithParam<int> {};

TEST_P(ReduceTest, ReduceScatterGivesEachRankItsBlockOfTheSum) {
  TSPEMU_SWEEP(check_reduce_scatter);
}

TEST_P(ReduceTest, AllReduceGivesEveryRankTheSum) {
  TSPEMU_SWEEP(check_all_reduce);
}

TEST_P(ReduceTest, ReduceGivesTheRootTheSumForEveryRoot) {
  TSPEMU_SWEEP(check_reduce);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReduceTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test
