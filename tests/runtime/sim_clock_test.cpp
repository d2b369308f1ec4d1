// The simulated clock's two-level topology and algorithm convention (sim_clock.hpp): ranks map to
// nodes contiguously or by a map, a ring whose group spans nodes pays the inter-node link for
// every step, a group inside one node the intra-node link, broadcast is charged as the pipelined
// ring, and bad topologies are refused naming the field and value.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tspemu/runtime/sim_streams.hpp"

namespace tspemu::test {
namespace {

SimClockModel two_nodes_of_two() {
  SimClockModel m = SimClockModel::mi300x_if();
  m.gpus_per_node = 2;
  return m;
}

TEST(SimClockTopology, MapsRanksToNodesContiguouslyOrByTheGivenMap) {
  SimClockModel m = two_nodes_of_two();
  EXPECT_EQ(m.node_of(0), 0);
  EXPECT_EQ(m.node_of(1), 0);
  EXPECT_EQ(m.node_of(2), 1);
  EXPECT_FALSE(m.spans_nodes({2, 3}));
  EXPECT_TRUE(m.spans_nodes({1, 2}));
  m.node_of_rank = {0, 1, 0, 1};  // round robin
  EXPECT_FALSE(m.spans_nodes({0, 2}));
  EXPECT_TRUE(m.spans_nodes({0, 1}));
  EXPECT_FALSE(SimClockModel::nvlink_node().spans_nodes({0, 1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(SimClockTopology, ChargesARingSpanningNodesAtTheInterNodeLinkAndANodeGroupAtItsOwn) {
  const SimClockModel m = two_nodes_of_two();
  const std::size_t block = 1 << 14;
  World world({.ranks = 4, .sim_clock = m});
  world.run([&](Rank& r) {
    std::vector<float> x(block, 1.0f), all(block * 4), pair(block * 2);
    all_gather<float>(r.comm(), x, all);  // world: ranks on both nodes
    Comm node = r.comm().split(r.id() / 2, r.id());
    all_gather<float>(node, x, pair);  // inside a node
  });
  const std::uint64_t bytes = block * sizeof(float);
  // The split is itself a collective of the world group: 2 dissemination rounds across nodes.
  const double expect = m.collective_seconds(CollectiveKind::all_gather, bytes, 4, true) +
                        m.collective_seconds(CollectiveKind::split, 0, 4, true) +
                        m.collective_seconds(CollectiveKind::all_gather, bytes, 2, false);
  EXPECT_NEAR(expect, 3 * (10e-6 + bytes / 50e9) + 2 * 10e-6 + (2e-6 + bytes / 448e9), 1e-12);
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(world.simulated_seconds(r), expect, 3e-9) << r;
}

TEST(SimClockTopology, MessageBetweenNodesPaysTheNetworkLink) {
  SimClockModel m = two_nodes_of_two();
  m.node_of_rank = {0, 0, 1, 1};
  const std::size_t count = 1 << 12;
  World world({.ranks = 4, .sim_clock = m});
  world.run([&](Rank& r) {
    std::vector<float> v(count, 2.0f);
    if (r.id() == 0) send<float>(r.comm(), std::span<const float>(v), 1);
    if (r.id() == 1) recv<float>(r.comm(), v, 0);
    if (r.id() == 1) send<float>(r.comm(), std::span<const float>(v), 2);
    if (r.id() == 2) recv<float>(r.comm(), v, 1);
  });
  const std::uint64_t bytes = count * sizeof(float);
  const double intra = 2e-6 + bytes / 448e9, inter = 10e-6 + bytes / 50e9;
  EXPECT_NEAR(world.simulated_seconds(1), intra, 2e-9);
  EXPECT_NEAR(world.simulated_seconds(2), intra + inter, 3e-9);
}

// The cost model's ring convention: a broadcast of N bytes moves (n-1)/n·N per rank in n-1 steps.
TEST(SimClockTopology, ChargesBroadcastAsThePipelinedRing) {
  const SimClockModel m = SimClockModel::nvlink_node();
  const std::size_t count = 1 << 16;
  World world({.ranks = 4, .sim_clock = m});
  world.run([&](Rank& r) {
    std::vector<float> v(count, 3.0f);
    broadcast<float>(r.comm(), v, 0);
  });
  const double bytes = count * sizeof(float);
  for (int r = 0; r < 4; ++r)
    EXPECT_NEAR(world.simulated_seconds(r), 3 * (2e-6 + bytes / 4 / 450e9), 3e-9) << r;
}

// The streams' accounting, directly: compute, a blocking collective (all exposed), and the entry
// points a non-blocking operation needs — it occupies the communication stream from issue, a
// second one queues behind it, and a wait exposes only what has not finished under compute.
TEST(SimStreams, BlockingIsExposedAndAWaitExposesOnlyTheRemainder) {
  SimStreams s;
  s.compute_until(100);
  const SimStreams::Transfer b = s.blocking(130, 50);  // last member arrives at 130
  EXPECT_EQ(b.begin_ns, 130);
  EXPECT_EQ(b.end_ns, 180);
  EXPECT_EQ(s.exposed_comm_ns(), 80);          // 30 waiting for the peers, 50 the transfer
  const SimStreams::Transfer x = s.issue(40);  // [180, 220)
  const SimStreams::Transfer y = s.issue(40);  // queues behind x: [220, 260)
  EXPECT_EQ(x.begin_ns, 180);
  EXPECT_EQ(y.begin_ns, 220);
  s.compute_until(200 + 30);  // 50 of compute: x finished at 220, under it
  s.wait(x);
  EXPECT_EQ(s.now_ns(), 230);
  EXPECT_EQ(s.overlapped_comm_ns(), 40);
  EXPECT_EQ(s.exposed_comm_ns(), 80);
  s.wait(y);  // 30 of y's 40 left after compute: exposed
  EXPECT_EQ(s.now_ns(), 260);
  EXPECT_EQ(s.exposed_comm_ns(), 80 + 30);
  EXPECT_EQ(s.overlapped_comm_ns(), 40 + 10);
  EXPECT_EQ(s.compute_ns(), 100 + 50);
  EXPECT_EQ(s.compute_ns() + s.exposed_comm_ns(), s.now_ns());
  // A blocking collective queues behind a pending transfer on the communication stream.
  const SimStreams::Transfer z = s.issue(100);  // [260, 360)
  const SimStreams::Transfer c = s.blocking(260, 10);
  EXPECT_EQ(c.begin_ns, 360);
  s.wait(z);  // over before the wait: nothing more exposed (c's wait already covered it)
  EXPECT_EQ(s.now_ns(), 370);
  EXPECT_EQ(s.exposed_comm_ns(), 110 + 110);
  // and nothing of z overlapped: the compute stream waited through all of it, in c's wait.
  EXPECT_EQ(s.overlapped_comm_ns(), 50);
}

// A transfer's overlapped time is the compute that ran during it, never the compute stream's
// waits: so overlapped never exceeds compute, however blocking and non-blocking calls interleave.
TEST(SimStreams, OverlapCountsOnlyTheComputeThatRanDuringATransfer) {
  SimStreams s;
  const SimStreams::Transfer x = s.issue(100);  // [0, 100)
  s.compute_until(40);                          // 40 of compute under x
  const SimStreams::Transfer c = s.blocking(40, 10);
  EXPECT_EQ(c.begin_ns, 100);  // queued behind x: the compute stream waits 40..110
  s.compute_until(130);
  const SimStreams::Transfer y = s.issue(50);  // [130, 180)
  s.compute_until(150);                        // 20 under y
  s.wait(y);                                   // 30 exposed
  s.wait(x);                                   // long over: 40 overlapped, nothing exposed
  EXPECT_EQ(s.now_ns(), 180);
  EXPECT_EQ(s.compute_ns(), 40 + 20 + 20);
  EXPECT_EQ(s.exposed_comm_ns(), 70 + 30);
  EXPECT_EQ(s.overlapped_comm_ns(), 40 + 20);
  EXPECT_EQ(s.compute_ns() + s.exposed_comm_ns(), s.now_ns());
  EXPECT_LE(s.overlapped_comm_ns(), s.compute_ns());
}

// In a run, compute spans and blocking collectives split every rank's clock into compute and
// exposed communication; nothing overlaps while every collective blocks.
TEST(SimStreams, ARunSplitsTheClockIntoComputeAndExposedCommunication) {
  const SimClockModel m = SimClockModel::nvlink_node();
  const double flops = 1e12;
  const std::size_t block = 1 << 14;
  World world({.ranks = 2, .sim_clock = m});
  world.run([&](Rank& r) {
    std::vector<float> x(block, 1.0f), all(2 * block);
    if (r.id() == 0) TraceSpan work(r.comm(), "gemm", flops);
    all_gather<float>(r.comm(), x, all);
  });
  const double gather = m.collective_seconds(CollectiveKind::all_gather, block * 4, 2);
  const World::SimulatedTime t0 = world.simulated_time(0), t1 = world.simulated_time(1);
  EXPECT_NEAR(t0.compute, m.compute_seconds(flops), 2e-9);
  EXPECT_NEAR(t0.exposed_comm, gather, 2e-9);
  EXPECT_EQ(t1.compute, 0);
  EXPECT_NEAR(t1.exposed_comm, m.compute_seconds(flops) + gather, 2e-9);  // waits for rank 0
  EXPECT_EQ(t0.overlapped_comm + t1.overlapped_comm, 0);
}

TEST(SimClockTopology, RefusesABadTopologyNamingTheFieldAndValue) {
  auto message = [](const SimClockModel& m, int ranks) {
    try {
      m.validate(ranks);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  SimClockModel m = SimClockModel::h100_nvlink();
  m.node_of_rank = {0, 1};
  EXPECT_NE(message(m, 4).find("node_of_rank has 2 entries for ranks=4"), std::string::npos);
  m.node_of_rank = {0, -1};
  EXPECT_NE(message(m, 2).find("node_of_rank[1]=-1"), std::string::npos);
  m = SimClockModel::h100_nvlink();
  m.gpus_per_node = -2;
  EXPECT_NE(message(m, 2).find("gpus_per_node=-2"), std::string::npos);
  m = SimClockModel::h100_nvlink();
  m.inter_beta_bytes_s = 0;
  EXPECT_NE(message(m, 2).find("must be > 0"), std::string::npos);
  m.inter_beta_bytes_s = 50e9;
  m.mfu = 1.5;
  EXPECT_NE(message(m, 2).find("mfu=1.5"), std::string::npos);
  EXPECT_THROW(World({.ranks = 2, .sim_clock = m}), std::invalid_argument);
  EXPECT_EQ(message(SimClockModel::h100_nvlink(), 16), "accepted");
}

}  // namespace
}  // namespace tspemu::test
