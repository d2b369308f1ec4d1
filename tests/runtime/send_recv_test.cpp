// Point-to-point: send/recv, isend/irecv, sendrecv ring shifts.
#include <gtest/gtest.h>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

class SendRecvTest : public ::testing::TestWithParam<int> {};

TEST_P(SendRecvTest, RingShiftsAndInFlightMessagesArriveInOrder) {
  TSPEMU_SWEEP(check_p2p);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SendRecvTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test

namespace tspemu::test {
namespace {

// Receives completed in the other order than posted must still release every send: the receiver's
// count of consumed messages must never move backwards (the sender would then wait forever for a
// message that was already copied).
TEST(SendRecvOrderTest, IrecvsFromOnePeerCompletedOutOfOrderReleaseEverySend) {
  World world(WorldOptions{.ranks = 2, .hang_timeout = std::chrono::seconds(5)});
  constexpr std::size_t kCount = 300;  // 1200 bytes: single copy, not eager
  world.run([&](Rank& r) {
    Comm& c = r.comm();
    std::vector<float> a(kCount, 1.0f), b(kCount, 2.0f);
    if (c.rank() == 1) {
      SendHandle sa = isend<float>(c, a, 0), sb = isend<float>(c, b, 0);
      barrier(c);  // the receiver has completed both, b first
      sa.wait();
      sb.wait();
    } else {
      std::vector<float> ga(kCount), gb(kCount);
      RecvHandle ra = irecv<float>(c, ga, 1), rb = irecv<float>(c, gb, 1);
      rb.wait();
      ra.wait();
      barrier(c);
      same(ga, a, "first message");
      same(gb, b, "second message");
    }
  });
}

}  // namespace
}  // namespace tspemu::test
