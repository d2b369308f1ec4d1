// Failures in a World spanning MPI processes (runtime/transport/mpi/run_end.cpp): a rank that
// throws, or fails while others read its block, ends every process promptly naming it; a hang
// reports the pending operations with global ranks; a process killed by SIGKILL ends the job
// (with killed_process.sh).
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mpi_world.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::test {
namespace {

TEST_P(MpiWorld, RankThatThrowsEndsEveryProcessNamingIt) {
  const int n = GetParam();
  World w(across(n));
  const auto start = std::chrono::steady_clock::now();
  try {
    w.run([&](Rank& r) {
      std::vector<float> x(100000, 1.0f);
      all_reduce<float>(r.comm(), x);
      if (r.id() == n - 1) throw std::runtime_error("injected failure on the last rank");
      all_reduce<float>(r.comm(), x);  // everyone else waits for the last rank here
    });
    FAIL() << "the run returned";
  } catch (const RankFailure& e) {
    EXPECT_EQ(e.rank(), n - 1);
    EXPECT_NE(e.diagnosis().find("injected failure on the last rank"), std::string::npos)
        << e.diagnosis();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 5.0) << "failure took " << s << " s to end the run";
}

// A rank failing after the meet (its all_gatherv's recv is one element short of the counts) while
// the others' reads of its block are in flight: every process ends promptly naming it, and the
// world runs again.
TEST_P(MpiWorld, RankFailingWhileOthersReadItsBlockEndsEveryProcessNamingIt) {
  const int n = GetParam();
  World w(across(n));
  constexpr std::size_t kCount = 100000;
  const auto start = std::chrono::steady_clock::now();
  try {
    w.run([&](Rank& r) {
      std::vector<float> v(kCount, static_cast<float>(r.id()));
      std::vector<float> all(kCount * static_cast<std::size_t>(n) - (r.id() == n - 1 ? 1 : 0));
      all_gatherv<float>(r.comm(), v, all);
    });
    FAIL() << "the run returned";
  } catch (const RankFailure& e) {
    EXPECT_EQ(e.rank(), n - 1) << e.diagnosis();
    EXPECT_NE(e.diagnosis().find("recv has " + std::to_string(kCount * n - 1) + " elements"),
              std::string::npos)
        << e.diagnosis();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 5.0) << "failure took " << s << " s to end the run";
  std::vector<int> right(static_cast<std::size_t>(n), 0);
  w.run([&](Rank& r) {
    std::vector<float> v(kCount, static_cast<float>(r.id()));
    std::vector<float> all(kCount * static_cast<std::size_t>(n));
    all_gatherv<float>(r.comm(), v, all);
    right[static_cast<std::size_t>(r.id())] =
        all.front() == 0.0f && all.back() == static_cast<float>(n - 1) ? 1 : 0;
  });
  for (int r = 0; r < n; ++r) {
    if (w.hosts(r)) {
      EXPECT_EQ(right[static_cast<std::size_t>(r)], 1) << "rank " << r;
    }
  }
}

TEST_P(MpiWorld, HangAcrossProcessesReportsPendingOperationsWithGlobalRanks) {
  const int n = GetParam();
  World w(WorldOptions{.ranks = n, .hang_timeout = std::chrono::milliseconds(1000), .mpi = true});
  try {
    w.run([&](Rank& r) {
      // The last rank stays away from the barrier past the hang timeout (busy, not returned), so
      // every other rank, in every process, is blocked in it when the first timeout fires.
      if (r.id() == n - 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2000));
        return;
      }
      barrier(r.comm());
    });
    FAIL() << "the run returned";
  } catch (const RankFailure& e) {
    const std::string& m = e.diagnosis();
    EXPECT_THROW(std::rethrow_exception(e.cause()), HangError);
    EXPECT_NE(m.find("pending operations:"), std::string::npos) << m;
    // This process's own ranks (global ids) are listed, those elsewhere named by process.
    for (int r = 0; r < n; ++r)
      if (w.hosts(r) && r != n - 1) {
        EXPECT_NE(m.find("rank " + std::to_string(r) + ": barrier #1"), std::string::npos) << m;
      }
    if (processes() > 1) {
      EXPECT_NE(m.find(": in process "), std::string::npos) << m;
    }
  }
}

// Run by killed_process.sh (which checks that mpirun ends the job, non-zero, within seconds);
// skipped otherwise, since it kills a process of the job.
TEST(MpiKilledProcess, SigkillOfAProcessDuringARunEndsTheJob) {
  if (std::getenv("TSPEMU_MPI_KILL_PROCESS") == nullptr || processes() == 1)
    GTEST_SKIP() << "run by killed_process.sh under mpirun";
  const int n = 2 * processes();
  World w(across(n));
  w.run([&](Rank& r) {
    std::vector<float> x(100000, 1.0f);
    all_reduce<float>(r.comm(), x);
    if (r.id() == n - 1) std::raise(SIGKILL);  // the last process, mid-run
    all_reduce<float>(r.comm(), x);            // the survivors wait here for the killed ranks
  });
  FAIL() << "the run survived the SIGKILL of the last process";
}

}  // namespace
}  // namespace tspemu::test
