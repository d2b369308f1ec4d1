// The Parker's wake handshake (runtime/transport/parker.hpp): membarrier-based when the kernel
// allows it, seq_cst on both sides otherwise or when TSPEMU_MEMBARRIER=0 forces it (the ctest
// runtime_tests_seq_cst_wake runs this whole binary so). Either way parked ranks are woken.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

TEST(WakeHandshake, IsSeqCstWhenTheEnvironmentTurnsMembarrierOff) {
  const char* env = std::getenv("TSPEMU_MEMBARRIER");
  if (env == nullptr || std::strcmp(env, "0") != 0)
    GTEST_SKIP() << "TSPEMU_MEMBARRIER is not 0 (runtime_tests_seq_cst_wake runs this)";
  EXPECT_STREQ(wake_handshake(), "seq_cst");
}

TEST(WakeHandshake, IsMembarrierOrSeqCstAndStaysSoForTheProcess) {
  shared_world(2);  // the first world decides
  const std::string first = wake_handshake();
  EXPECT_TRUE(first == "membarrier" || first == "seq_cst") << first;
  EXPECT_EQ(wake_handshake(), first);
}

// Receivers that park (the root sleeps well past the spin and yield phases before each
// broadcast) are woken by the root's publish every time: each call's payload arrives, and the
// 8-rank world, oversubscribed on small machines, parks and wakes on every call.
TEST(WakeHandshake, ParkedReceiversOfEagerBroadcastsWakeWithEveryPayload) {
  World& world = shared_world(8);
  world.run([](Rank& r) {
    for (int i = 0; i < 30; ++i) {
      std::vector<double> v = {r.id() == 3 ? 1.5 * i : -1.0};
      if (r.id() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      broadcast<double>(r.comm(), v, 3);
      EXPECT_EQ(v[0], 1.5 * i) << "rank " << r.id() << " call " << i;
    }
  });
}

}  // namespace
}  // namespace tspemu::test
