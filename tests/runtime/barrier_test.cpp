// barrier: returns only after every member entered; counts calls, no bytes; world and sub-groups.
#include <gtest/gtest.h>

#include <atomic>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

class BarrierTest : public ::testing::TestWithParam<int> {};

TEST_P(BarrierTest, BarrierCountsCallsAndNoBytes) {
  const int n = GetParam();
  World& world = shared_world(n);
  world.run([&](Rank& r) { check_barrier(r, r.comm()); });
  const std::pair<int, int> mesh = mesh_of(n);
  const int mt = mesh.first, ms = mesh.second;
  world.run([&](Rank& r) {
    Mesh m = split_mesh(r, mt, ms);
    check_barrier(r, m.row);
    check_barrier(r, m.col);
  });
}

TEST_P(BarrierTest, NoRankLeavesBeforeEveryRankEntered) {
  const int n = GetParam();
  World& world = shared_world(n);
  std::atomic<int> entered{0};
  world.run([&](Rank& r) {
    for (int round = 1; round <= 20; ++round) {
      if ((r.id() + round) % 3 == 0) std::this_thread::yield();
      ++entered;
      barrier(r.comm());
      EXPECT_GE(entered.load(), round * n);
      barrier(r.comm());
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, BarrierTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test
