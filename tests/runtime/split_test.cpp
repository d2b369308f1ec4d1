// Comm::split: group membership and order by (key, rank), names, nested splits, independent
// sequence numbers and mailboxes per group.
#include <gtest/gtest.h>

#include <vector>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

TEST(Split, MembersAreOrderedByKeyThenRank) {
  World& world = shared_world(6);
  world.run([](Rank& r) {
    // Colors: even/odd; keys reverse the order, and ties (key 0 for ranks 4, 5) break by rank.
    const int key = r.id() >= 4 ? 0 : 10 - r.id();
    Comm c = r.comm().split(r.id() % 2, key);
    EXPECT_EQ(c.size(), 3);
    EXPECT_EQ(c.name(), "world/" + std::to_string(r.id() % 2));
    std::vector<int> members;
    for (int i = 0; i < c.size(); ++i) members.push_back(c.world_rank(i));
    if (r.id() % 2 == 0)
      EXPECT_EQ(members, (std::vector<int>{4, 2, 0}));
    else
      EXPECT_EQ(members, (std::vector<int>{5, 3, 1}));
    EXPECT_EQ(c.world_rank(c.rank()), r.id());
    EXPECT_THROW((void)c.world_rank(3), std::invalid_argument);
    // Data follows group ranks.
    std::int32_t mine = r.id(), all[3];
    all_gather<std::int32_t>(c, std::span<const std::int32_t>(&mine, 1), all);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(all[i], members[static_cast<std::size_t>(i)]);
  });
}

TEST(Split, MeshRowsAndColumnsAndNestedSplitsRunIndependently) {
  World& world = shared_world(8);
  world.run([](Rank& r) {
    Mesh m = split_mesh(r, 2, 4);
    EXPECT_EQ(m.row.name(), "row" + std::to_string(r.id() / 4));
    EXPECT_EQ(m.row.size(), 4);
    EXPECT_EQ(m.col.size(), 2);
    EXPECT_EQ(m.col.rank(), 1 - r.id() / 4);  // reversed key
    // Interleave collectives on different groups: each has its own sequence numbers.
    for (int i = 0; i < 5; ++i) {
      check_all_reduce<float>(r, m.row, 300, "float");
      check_broadcast<std::int64_t>(r, m.col, 100, "int64");
      if (i % 2 == 0) check_barrier(r, r.comm());
    }
    Comm half = m.row.split(m.row.rank() / 2, m.row.rank());
    EXPECT_EQ(half.size(), 2);
    EXPECT_EQ(half.name(), m.row.name() + "/" + std::to_string(m.row.rank() / 2));
    check_p2p<double>(r, half, 1000, "double");
    check_all_to_all<std::int32_t>(r, half, 33, "int32");
    // A singleton group works too.
    Comm self = r.comm().split(r.id(), 0);
    EXPECT_EQ(self.size(), 1);
    check_all_reduce<double>(r, self, 1000, "double");
    check_p2p<float>(r, self, 1000, "float");
  });
}

TEST(Split, SplitCountsAsACallAndRepeatedSplitsMakeFreshGroups) {
  World& world = shared_world(4);
  world.clear_counters();
  world.run([](Rank& r) {
    for (int i = 0; i < 20; ++i) {
      Comm c = r.comm().split(r.id() / 2, 0);
      check_all_gather<float>(r, c, 65, "float");
    }
  });
  EXPECT_EQ(world.counters(0)[CollectiveKind::split].calls, 20u);
  EXPECT_EQ(world.counters(0)[CollectiveKind::split].bytes_sent, 0u);
}

TEST(Split, NegativeColorGivesAnInvalidCommAndTheOthersAGroup) {
  World& world = shared_world(5);
  world.run([](Rank& r) {
    Comm c = r.comm().split(r.id() == 0 ? -1 : 7, r.id());
    if (r.id() == 0) {
      EXPECT_FALSE(c.valid());
      EXPECT_EQ(c.size(), 0);
      EXPECT_EQ(c.name(), "<no group>");
    } else {
      EXPECT_TRUE(c.valid());
      EXPECT_EQ(c.size(), 4);
      EXPECT_EQ(c.rank(), r.id() - 1);
      check_all_reduce<std::int32_t>(r, c, 1000, "int32");
    }
  });
}

}  // namespace
}  // namespace tspemu::test

namespace tspemu::test {
namespace {

// A member that finishes with a new group (an eager send needs no peer) and drops its Comm before
// a slower member has looked the group up must not make that member get a fresh, empty group.
TEST(Split, SlowMemberFindsTheGroupAFastMemberAlreadyDropped) {
  World world({.ranks = 2, .hang_timeout = std::chrono::seconds(5)});
  const int iterations = quick() ? 300 : 3000;
  world.run([&](Rank& r) {
    for (int i = 0; i < iterations; ++i) {
      std::int32_t x = i, y = -1;
      if (r.id() == 0) {
        Comm c = r.comm().split(0, r.id());
        send<std::int32_t>(c, std::span<const std::int32_t>(&x, 1), 1);
      } else {
        Comm c = r.comm().split(0, r.id());
        recv<std::int32_t>(c, std::span<std::int32_t>(&y, 1), 0);
        ASSERT_EQ(y, i);
      }
    }
  });
}

}  // namespace
}  // namespace tspemu::test
