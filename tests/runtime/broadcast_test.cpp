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

// Runs of eager broadcasts longer than the mailbox ring (a root may run ahead of the receivers)
// with rotating roots and sizes up to the eager limit, between collectives that meet: every
// receiver gets every payload exactly, on 8 ranks (oversubscribed on small machines).
TEST(Broadcast, LongRunsOfEagerBroadcastsWithRotatingRootsStayExact) {
  World& world = shared_world(8);
  world.run([](Rank& r) {
    const int n = r.size();
    for (int run = 0; run < 4; ++run) {
      for (int i = 0; i < 50; ++i) {
        const int root = (i * 3 + run) % n;
        const std::size_t count = 1 + static_cast<std::size_t>(i % 64);  // up to 256 bytes
        std::vector<float> a(count, -1.0f);
        if (r.id() == root)
          for (std::size_t k = 0; k < count; ++k) a[k] = static_cast<float>(i * 100 + root + k);
        broadcast<float>(r.comm(), a, root);
        for (std::size_t k = 0; k < count; ++k)
          ASSERT_EQ(a[k], static_cast<float>(i * 100 + root + k))
              << "rank " << r.id() << " run " << run << " call " << i;
      }
      std::vector<float> one = {1.0f};
      all_reduce<float>(r.comm(), std::span(one));
      ASSERT_EQ(one[0], static_cast<float>(n));
    }
  });
}

// One root far ahead of a receiver that lags (it sleeps now and then), over many times the mailbox
// ring: the root settles in batches whenever the ring needs a descriptor back, and every receiver
// still gets every payload exactly, whether it fits in the descriptor's first line (8 B), runs
// past it (12 B) or fills the eager limit (256 B).
TEST(Broadcast, OneRootFarAheadOfALaggingReceiverOverManyRingLapsStaysExact) {
  for (const int n : {2, 4}) {
    World& world = shared_world(n);
    for (const std::size_t count : {std::size_t{2}, std::size_t{3}, std::size_t{64}}) {
      world.run([&](Rank& r) {
        for (int i = 0; i < 1000; ++i) {
          std::vector<float> a(count, -1.0f);
          if (r.id() == 0)
            for (std::size_t k = 0; k < count; ++k) a[k] = static_cast<float>(i * 7 + k);
          if (r.id() == n - 1 && i % 97 == 0)
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          broadcast<float>(r.comm(), a, 0);
          for (std::size_t k = 0; k < count; ++k)
            ASSERT_EQ(a[k], static_cast<float>(i * 7 + k))
                << "rank " << r.id() << " of " << n << ", count " << count << ", call " << i;
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, BroadcastTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test
