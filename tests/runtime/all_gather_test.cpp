// all_gather and all_gatherv: blocks in group-rank order, in place and out of place.
#include <gtest/gtest.h>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

class AllGatherTest : public ::testing::TestWithParam<int> {};

TEST_P(AllGatherTest, EqualCountsConcatenateInRankOrderInAndOutOfPlace) {
  TSPEMU_SWEEP(check_all_gather);
}

TEST_P(AllGatherTest, VariableCountsConcatenateInRankOrderInAndOutOfPlace) {
  TSPEMU_SWEEP(check_all_gatherv);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllGatherTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test
