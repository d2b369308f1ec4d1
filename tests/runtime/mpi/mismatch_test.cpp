// Calls that do not match across MPI processes (runtime/transport/mpi.hpp: opens, held opens and
// their fingerprints): every process fails naming both calls and the deviating rank, whether the
// difference is seen where the root runs, where a receiver runs or only at the run's end; a
// message to another process never received fails every process.
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

#include "mpi_world.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::test {
namespace {

TEST_P(MpiWorld, MismatchAcrossProcessesNamesBothCallsInEveryProcess) {
  const int n = GetParam();
  World w(across(n));
  try {
    w.run([&](Rank& r) {
      // The last rank lives in the last process, rank 0 in the first.
      std::vector<float> x(r.id() == n - 1 ? 5 : 4, 1.0f);
      all_reduce<float>(r.comm(), x);
    });
    FAIL() << "the mismatched all_reduce returned";
  } catch (const RankFailure& e) {
    const std::string& m = e.diagnosis();
    // The headline names the deviating last rank, then the call the others made.
    EXPECT_NE(m.find("collective #1 on group world: rank " + std::to_string(n - 1) +
                     " called all_reduce(count=5, float) while ranks 0-" + std::to_string(n - 2) +
                     " called all_reduce(count=4, float)"),
              std::string::npos)
        << m;
    EXPECT_THROW(std::rethrow_exception(e.cause()), CollectiveMismatch);
  }
  // The world is usable after the failure (messages of the failed run are dropped).
  std::vector<float> sums(static_cast<std::size_t>(n));
  w.run([&](Rank& r) {
    std::vector<float> x(3, static_cast<float>(r.id()));
    all_reduce<float>(r.comm(), x);
    sums[static_cast<std::size_t>(r.id())] = x[2];
  });
  const int ids = n * (n - 1) / 2;  // 0 + 1 + ... + n-1, a whole number
  for (int r = 0; r < n; ++r)
    if (w.hosts(r)) {
      EXPECT_EQ(sums[static_cast<std::size_t>(r)], static_cast<float>(ids));
    }
}

// A small broadcast's receivers send nothing (mpi.hpp: held opens): each checks the root's
// fingerprint where it runs, and the failure of the first to see a difference ends every process.
TEST_P(MpiWorld, SmallBroadcastWhoseReceiverDisagreesWithTheRootFailsEveryProcessNamingBoth) {
  const int n = GetParam();
  World w(across(n));
  try {
    w.run([&](Rank& r) {
      // The last rank lives in the last process, the root (rank 0) in the first.
      std::vector<float> b(r.id() == n - 1 ? 3 : 2, static_cast<float>(r.id()));
      broadcast<float>(r.comm(), b, 0);
    });
    FAIL() << "the mismatched broadcast returned";
  } catch (const RankFailure& e) {
    const std::string& m = e.diagnosis();
    EXPECT_NE(m.find("collective #1 on group world: rank " + std::to_string(n - 1) +
                     " called broadcast(count=3, float, root=0) while rank 0, the root it names, "
                     "called broadcast(count=2, float, root=0)"),
              std::string::npos)
        << m;
    EXPECT_THROW(std::rethrow_exception(e.cause()), CollectiveMismatch);
  }
  std::vector<float> got(static_cast<std::size_t>(n), -1.0f);
  w.run([&](Rank& r) {
    std::vector<float> b(2, static_cast<float>(r.id() + 7));
    broadcast<float>(r.comm(), b, n - 1);
    got[static_cast<std::size_t>(r.id())] = b[1];
  });
  for (int r = 0; r < n; ++r)
    if (w.hosts(r)) {
      EXPECT_EQ(got[static_cast<std::size_t>(r)], static_cast<float>(n - 1 + 7)) << "rank " << r;
    }
}

// A receiver whose broadcast is too large to be eager meets every member, including receivers
// in other processes that hold their opens back: it waits for their held fingerprints and reads
// the disagreement from them.
TEST_P(MpiWorld, LargeBroadcastAgainstSmallOnesAcrossProcessesNamesTheDeviatingRank) {
  const int n = GetParam();
  World w(across(n));
  try {
    w.run([&](Rank& r) {
      std::vector<float> b(r.id() == n - 1 ? 100 : 2, 1.0f);
      broadcast<float>(r.comm(), b, 0);
    });
    FAIL() << "the mismatched broadcast returned";
  } catch (const RankFailure& e) {
    const std::string& m = e.diagnosis();
    EXPECT_NE(m.find("collective #1 on group world: rank " + std::to_string(n - 1) +
                     " called broadcast(count=100, float, root=0) while ranks 0-" +
                     std::to_string(n - 2) + " called broadcast(count=2, float, root=0)"),
              std::string::npos)
        << m;
    EXPECT_THROW(std::rethrow_exception(e.cause()), CollectiveMismatch);
  }
}

// Two ranks in different processes that each name themselves the root both return at once; the
// receivers agree with one of them. The difference is found when the members' fingerprints meet
// at the end of the run, including those of receivers that held their opens back.
TEST_P(MpiWorld, SmallBroadcastWithTwoSelfNamedRootsInDifferentProcessesFailsAtTheRunsEnd) {
  const int n = GetParam();
  World w(across(n));
  try {
    w.run([&](Rank& r) {
      std::vector<float> b(2, 1.0f);
      for (int call = 0; call < 40; ++call)
        broadcast<float>(r.comm(), b, call == 37 && r.id() == n - 1 ? n - 1 : 0);
    });
    FAIL() << "the run with two roots returned";
  } catch (const RankFailure& e) {
    const std::string& m = e.diagnosis();
    EXPECT_NE(m.find("collective #38 on group world: rank " + std::to_string(n - 1) +
                     " called broadcast(count=2, float, root=" + std::to_string(n - 1) + ")"),
              std::string::npos)
        << m;
    EXPECT_THROW(std::rethrow_exception(e.cause()), CollectiveMismatch);
  }
}

// A held open carries its calls' fingerprints as runs of equal ones (mpi/wire.hpp: HeldRun): counts
// that change every call, every few calls and not at all within one hold must each reach the
// other processes as they were, so a call that meets every member finds no difference where
// there is none, and the run's end names the call where there is one, with its count.
TEST_P(MpiWorld, HeldOpensWithChangingCountsCarryEveryCallsFingerprint) {
  const int n = GetParam();
  World w(across(n));
  auto count_of = [](int call) {
    return static_cast<std::size_t>(call < 40 ? 1 + call % 3 : call < 80 ? 1 + (call / 5) % 3 : 2);
  };
  std::vector<int> wrong(static_cast<std::size_t>(n), 0);
  w.run([&](Rank& r) {
    for (int call = 0; call < 120; ++call) {
      std::vector<float> b(count_of(call), static_cast<float>(r.id() == 0 ? call : -1));
      broadcast<float>(r.comm(), b, 0);
      if (b.back() != static_cast<float>(call)) ++wrong[static_cast<std::size_t>(r.id())];
    }
    std::vector<float> x(2, 1.0f);
    all_reduce<float>(r.comm(), x);  // meets every member: compares every held fingerprint
    if (x[0] != static_cast<float>(n)) ++wrong[static_cast<std::size_t>(r.id())];
  });
  for (int r = 0; r < n; ++r)
    if (w.hosts(r)) {
      EXPECT_EQ(wrong[static_cast<std::size_t>(r)], 0) << "rank " << r;
    }
  try {
    w.run([&](Rank& r) {
      for (int call = 0; call < 60; ++call) {
        std::vector<float> b(1 + static_cast<std::size_t>(call / 5 % 3), 1.0f);
        broadcast<float>(r.comm(), b, call == 52 && r.id() == n - 1 ? n - 1 : 0);
      }
    });
    FAIL() << "the run with two roots returned";
  } catch (const RankFailure& e) {
    const std::string& m = e.diagnosis();
    EXPECT_NE(m.find("collective #53 on group world: rank " + std::to_string(n - 1) +
                     " called broadcast(count=2, float, root=" + std::to_string(n - 1) +
                     ") while ranks 0-" + std::to_string(n - 2) +
                     " called broadcast(count=2, float, root=0)"),
              std::string::npos)
        << m;
    EXPECT_THROW(std::rethrow_exception(e.cause()), CollectiveMismatch);
  }
}

TEST_P(MpiWorld, MessageToAnotherProcessNeverReceivedFailsEveryProcess) {
  const int n = GetParam();
  World w(across(n));
  try {
    w.run([&](Rank& r) {
      std::vector<float> x(16, 1.0f);
      if (r.id() == 0) send<float>(r.comm(), x, n - 1);  // rank n-1 never receives it
    });
    FAIL() << "the run returned";
  } catch (const RankFailure& e) {
    const std::string& m = e.diagnosis();
    EXPECT_EQ(e.rank(), 0) << m;
    EXPECT_NE(m.find("unreceived message: rank 0 sent message #1 (64 B) to rank " +
                     std::to_string(n - 1)),
              std::string::npos)
        << m;
    EXPECT_THROW(std::rethrow_exception(e.cause()), CollectiveMismatch);
  }
  w.run([&](Rank& r) { barrier(r.comm()); });  // the next run starts clean
}

}  // namespace
}  // namespace tspemu::test
