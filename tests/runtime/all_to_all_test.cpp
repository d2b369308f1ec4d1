// all_to_all: rank r's block q lands in rank q's block r.
#include <gtest/gtest.h>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

class AllToAllTest : public ::testing::TestWithParam<int> {};

TEST_P(AllToAllTest, BlocksAreTransposedAcrossRanks) {
  TSPEMU_SWEEP(check_all_to_all);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllToAllTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test
