// A World spanning MPI processes as a whole: every process's trace holds every rank's events once,
// with aligned clocks and flows across processes; ranks the processes do not divide are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi_world.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/trace.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::test {
namespace {

TEST_P(MpiWorld, TraceInEveryProcessHasEveryRanksEventsOnce) {
  const int n = GetParam();
  WorldOptions o = across(n);
  o.trace = true;
  World w(o);
  auto schedule = [&](Rank& r) {
    std::vector<float> x(1000, 1.0f);
    all_reduce<float>(r.comm(), x);
    // Rank 0 (first process) to rank n-1 (last process): a flow across processes.
    if (r.id() == 0) send<float>(r.comm(), x, n - 1);
    if (r.id() == n - 1) recv<float>(r.comm(), x, 0);
  };
  auto count = [&](int rank, const char* name) {
    int k = 0;
    for (const TraceEvent& e : w.trace().events(rank)) k += std::string(e.name) == name ? 1 : 0;
    return k;
  };
  w.run(schedule);
  w.run(schedule);  // recording continues across runs; each process's copy is not doubled
  const Trace t = w.trace();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(count(r, "all_reduce"), 2) << "rank " << r << (w.hosts(r) ? "" : " (elsewhere)");
    for (const TraceEvent& e : t.events(r))
      if (e.type == TraceEvent::Type::collective) {
        EXPECT_EQ(t.group_name(e.group_id), "world") << "rank " << r;
      }
  }
  // The receive at rank n-1 carries the flow id of rank 0's send, whichever process holds them.
  std::vector<std::uint64_t> sends, recvs;
  for (const TraceEvent& e : t.events(0))
    if (e.type == TraceEvent::Type::send) sends.push_back(e.flow);
  for (const TraceEvent& e : t.events(n - 1))
    if (e.type == TraceEvent::Type::recv) recvs.push_back(e.flow);
  EXPECT_EQ(sends.size(), 2u);
  EXPECT_EQ(sends, recvs);
  // Aligned clocks: every rank's first all_reduce starts within a second of rank 0's.
  auto first = [&](int rank) {
    for (const TraceEvent& e : t.events(rank))
      if (std::string(e.name) == "all_reduce") return e.begin_ns;
    return std::int64_t{-1};
  };
  for (int r = 1; r < n; ++r) EXPECT_LT(std::llabs(first(r) - first(0)), 1'000'000'000) << r;
  w.trace().clear();
  w.run(schedule);
  for (int r = 0; r < n; ++r) EXPECT_EQ(count(r, "all_reduce"), 1) << "rank " << r;
}

TEST(MpiWorldOptions, RanksNotDivisibleByProcessesIsRejectedNamingBoth) {
  if (processes() == 1) GTEST_SKIP() << "needs several processes";
  const int n = processes() + 1;
  try {
    World w(WorldOptions{.ranks = n, .mpi = true});
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks=" + std::to_string(n)), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(processes()) + " MPI processes"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace tspemu::test
