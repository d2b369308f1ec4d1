// World: ranks as threads kept between runs, 64 ranks, no thread leaks, inspection between runs.
#include "tspemu/runtime/world.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "collective_checks.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::test {
namespace {

TEST(World, EveryRankRunsOnItsOwnThreadWithItsId) {
  World world({.ranks = 5});
  EXPECT_EQ(world.size(), 5);
  EXPECT_EQ(world.options().ranks, 5);
  std::vector<std::thread::id> tids(5);
  std::atomic<int> calls{0};
  world.run([&](Rank& r) {
    EXPECT_EQ(r.size(), 5);
    EXPECT_EQ(r.comm().size(), 5);
    EXPECT_EQ(r.comm().rank(), r.id());
    EXPECT_EQ(r.comm().world_rank(r.id()), r.id());
    EXPECT_EQ(r.comm().name(), "world");
    EXPECT_EQ(&r.arena(), &world.arena(r.id()));
    tids[static_cast<std::size_t>(r.id())] = std::this_thread::get_id();
    ++calls;
  });
  EXPECT_EQ(calls.load(), 5);
  std::set<std::thread::id> distinct(tids.begin(), tids.end());
  EXPECT_EQ(distinct.size(), 5u);
  EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0u);
  // Threads are kept between runs.
  world.run([&](Rank& r) {
    EXPECT_EQ(tids[static_cast<std::size_t>(r.id())], std::this_thread::get_id());
  });
}

TEST(World, SixtyFourRanksRunCollectives) {
  World world({.ranks = 64});
  for (int i = 0; i < (quick() ? 2 : 10); ++i)
    world.run([](Rank& r) {
      check_all_reduce<float>(r, r.comm(), 1000, "float");
      check_all_gather<std::int32_t>(r, r.comm(), 7, "int32");
      check_broadcast<double>(r, r.comm(), 300, "double");
      check_barrier(r, r.comm());
      Mesh m = split_mesh(r, 8, 8);
      check_all_reduce<std::int64_t>(r, m.row, 100, "int64");
      check_reduce_scatter<float>(r, m.col, 64, "float");
    });
}

TEST(World, RepeatedRunsAndWorldsLeakNoThreads) {
  const int before = thread_count();
  {
    World world({.ranks = 8});
    EXPECT_EQ(thread_count(), before + 8);
    std::atomic<long> sum{0};
    const int runs = quick() ? 50 : 200;
    for (int i = 0; i < runs; ++i)
      world.run([&](Rank& r) {
        std::int64_t x = r.id() + i;
        std::int64_t y = 0;
        all_reduce<std::int64_t>(r.comm(), std::span<const std::int64_t>(&x, 1),
                                 std::span<std::int64_t>(&y, 1));
        sum += y;
      });
    EXPECT_EQ(sum.load(), 8L * (28L * runs + 8L * (runs - 1) * runs / 2));
    EXPECT_EQ(thread_count(), before + 8);
  }
  EXPECT_EQ(thread_count(), before);
  for (int i = 0; i < 20; ++i) {
    World w({.ranks = 4});
    w.run([](Rank& r) { barrier(r.comm()); });
  }
  EXPECT_EQ(thread_count(), before);
}

// Calls count from 0 again in each run, so a member's mailbox still holds the last run's calls of
// the same numbers: a rank that enters first must wait for the late member's new message, not
// take the old one (the shared-memory transport's descriptor stamps are cleared between runs).
TEST(World, ARankAheadOfALatePeerReadsThisRunsMessagesNotTheLastRuns) {
  World world({.ranks = 2});
  const int calls = 20;
  auto gather_all = [&](int run, bool late) {
    std::vector<int> seen;
    world.run([&](Rank& r) {
      for (int i = 0; i < calls; ++i) {
        if (late && r.id() == 1 && i < 3)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        const int mine = 1000 * run + 10 * i + r.id();
        int both[2] = {-1, -1};
        all_gather<int>(r.comm(), std::span<const int>(&mine, 1), std::span<int>(both, 2));
        if (r.id() == 0) seen.insert(seen.end(), both, both + 2);
      }
    });
    return seen;
  };
  gather_all(1, false);
  const std::vector<int> seen = gather_all(2, true);
  ASSERT_EQ(seen.size(), 2u * calls);
  for (int i = 0; i < calls; ++i) {
    EXPECT_EQ(seen[2 * i], 2000 + 10 * i) << "call " << i;
    EXPECT_EQ(seen[2 * i + 1], 2000 + 10 * i + 1) << "call " << i << ": rank 1's message";
  }
}

TEST(World, FailedRunsLeaveTheWorldUsableAndLeakNoThreads) {
  const int before = thread_count();
  {
    World world({.ranks = 8});
    for (int i = 0; i < (quick() ? 50 : 200); ++i) {
      const int bad = i % 8;
      EXPECT_THROW(world.run([&](Rank& r) {
        std::vector<float> v(1000, 1.0f);
        all_reduce<float>(r.comm(), std::span<float>(v));
        if (r.id() == bad) throw std::runtime_error("bad");
        all_reduce<float>(r.comm(), std::span<float>(v));
      }),
                   RankFailure);
      std::atomic<int> ok{0};
      world.run([&](Rank& r) {
        std::vector<float> v(100, 1.0f);
        all_reduce<float>(r.comm(), std::span<float>(v));
        if (v[0] == 8.0f) ++ok;
      });
      EXPECT_EQ(ok.load(), 8);
    }
    EXPECT_EQ(thread_count(), before + 8);
  }
  EXPECT_EQ(thread_count(), before);
}

TEST(World, CountersAccumulateAcrossRunsUntilCleared) {
  World world({.ranks = 3});
  for (int i = 0; i < 2; ++i)
    world.run([](Rank& r) {
      std::vector<float> v(100);
      broadcast<float>(r.comm(), v, 0);
    });
  const auto& c0 = world.counters(0)[CollectiveKind::broadcast];
  EXPECT_EQ(c0.calls, 2u);
  EXPECT_EQ(c0.bytes_sent, 2u * 2 * 400);
  EXPECT_EQ(world.counters(1)[CollectiveKind::broadcast].bytes_received, 800u);
  EXPECT_EQ(world.counters(0).total_sent(), 1600u);
  EXPECT_EQ(world.counters(2).total_received(), 800u);
  world.clear_counters();
  EXPECT_EQ(world.counters(0).total_sent(), 0u);
  EXPECT_EQ(world.counters(0)[CollectiveKind::broadcast].calls, 0u);
}

TEST(World, ArenaPeaksRestartEachRunAndAreInspectableAfterIt) {
  World world({.ranks = 2});
  world.run(
      [](Rank& r) { auto b = r.arena().allocate<std::byte>(1000 * (r.id() + 1), Category::kv); });
  EXPECT_EQ(world.arena(0).stats().peak, 1024u);
  EXPECT_EQ(world.arena(1).stats().peak, 2048u);
  EXPECT_EQ(world.arena(1).stats().current, 0u);
  world.run([](Rank& r) { auto b = r.arena().allocate<std::byte>(64, Category::kv); });
  EXPECT_EQ(world.arena(1).stats().peak, 64u);
  EXPECT_THROW(world.arena(2), std::out_of_range);
}

}  // namespace
}  // namespace tspemu::test
