// broadcast: every root's buffer reaches every rank exactly, world and mesh sub-groups.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

class BroadcastTest : public ::testing::TestWithParam<int> {};

TEST_P(BroadcastTest, EveryRankGetsTheRootsBufferForEveryRootCountAndType) {
  TSPEMU_SWEEP(check_broadcast);
}

// The root of a small broadcast returns once its payload is in the mailbox: it may overwrite its
// buffer at once, and the receivers, entering only after that, still get the payload it sent.
TEST(Broadcast, EagerRootReturnsBeforeTheReceiversEnterAndMayReuseItsBuffer) {
  World& world = shared_world(4);
  for (int round = 0; round < 20; ++round) {
    std::atomic<bool> root_returned{false};
    std::atomic<int> late{0};
    world.run([&](Rank& r) {
      std::vector<float> a = {r.id() == 1 ? 3.0f : 0.0f, r.id() == 1 ? 5.0f : 0.0f};
      if (r.id() == 1) {
        broadcast<float>(r.comm(), a, 1);
        a = {-1.0f, -1.0f};
        // seq_cst: orders the buffer reuse before the receivers enter.
        root_returned.store(true, std::memory_order_seq_cst);
      } else {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!root_returned.load(std::memory_order_seq_cst) &&
               std::chrono::steady_clock::now() < give_up)
          std::this_thread::yield();
        if (!root_returned.load(std::memory_order_seq_cst)) ++late;
        broadcast<float>(r.comm(), a, 1);
        EXPECT_EQ(a, (std::vector<float>{3.0f, 5.0f})) << "rank " << r.id();
      }
      // A second call reuses the mailbox slot parity of the next-but-one call: still exact.
      std::vector<float> b = {static_cast<float>(r.id() == 1 ? 7 : 0)};
      broadcast<float>(r.comm(), b, 1);
      EXPECT_EQ(b[0], 7.0f) << "rank " << r.id();
    });
    EXPECT_EQ(late.load(), 0) << "the root waited for the receivers";
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, BroadcastTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test
