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

// Rank 0's block travels in its mailbox, every other rank's is read from its own buffer: the
// exposing ranks must not return (and overwrite their buffer) before rank 0 has read it, though
// rank 0 itself exposes nothing.
TEST_P(AllGatherTest, VariableCountsMixingMailboxAndInPlaceBlocksKeepBuffersUntilRead) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "needs a peer";
  World& world = shared_world(n);
  world.run([&](Rank& r) {
    Comm& c = r.comm();
    const auto count = [](int q) { return q == 0 ? std::size_t{1} : std::size_t{1024}; };
    std::size_t total = 0;
    for (int q = 0; q < n; ++q) total += count(q);
    std::vector<float> send(count(c.rank()));
    std::vector<float> recv(total);
    for (int iter = 0; iter < 50; ++iter) {
      std::fill(send.begin(), send.end(), static_cast<float>(c.rank() * 100 + iter));
      all_gatherv<float>(c, send, recv);
      std::size_t at = 0;
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count(q); ++i, ++at)
          ASSERT_EQ(recv[at], static_cast<float>(q * 100 + iter))
              << "rank " << c.rank() << " iteration " << iter << " block of rank " << q;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllGatherTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test
