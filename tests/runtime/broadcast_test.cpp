// broadcast: every root's buffer reaches every rank exactly, world and mesh sub-groups.
#include <gtest/gtest.h>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

class BroadcastTest : public ::testing::TestWithParam<int> {};

TEST_P(BroadcastTest, EveryRankGetsTheRootsBufferForEveryRootCountAndType) {
  TSPEMU_SWEEP(check_broadcast);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, BroadcastTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test
