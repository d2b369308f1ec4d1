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
