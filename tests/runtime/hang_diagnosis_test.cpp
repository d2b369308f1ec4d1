// Deliberately broken schedules: each must fail within a bounded time (never hang) with the exact
// diagnosis — every rank's pending operation and the wait-for cycle (watchdog.hpp) — and every
// failure carries the flight recorder of every rank (flight_recorder.hpp).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include <atomic>
#include <cctype>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kWatchdog = 250ms;

WorldOptions hang_options(int ranks) {
  return {.ranks = ranks, .hang_timeout = 20s, .watchdog_timeout = kWatchdog};
}

// Durations vary run to run: "0.27 s" becomes "T s". A hand scan, not std::regex: GCC 12 warns
// maybe-uninitialized inside <regex> under -O2 with ASan, and CI builds with -Werror.
std::string without_times(const std::string& s) {
  const auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  std::string out;
  std::size_t i = 0;
  while (i < s.size()) {
    // Try to read "<digits>.<digits> s" at i, ending at a word boundary.
    std::size_t k = i;
    while (k < s.size() && digit(s[k])) ++k;
    const bool whole = k > i && (i == 0 || !digit(s[i - 1]));
    if (whole && k < s.size() && s[k] == '.') {
      const std::size_t frac = ++k;
      while (k < s.size() && digit(s[k])) ++k;
      const bool boundary =
          k + 2 == s.size() ||
          (k + 2 < s.size() && std::isalnum(static_cast<unsigned char>(s[k + 2])) == 0);
      if (k > frac && s.compare(k, 2, " s") == 0 && boundary) {
        out += "T s";
        i = k + 2;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

// Runs fn, expects RankFailure within `bound`, returns it.
RankFailure run_failing(World& w, const std::function<void(Rank&)>& fn,
                        Clock::duration bound = 3s) {
  const auto t0 = Clock::now();
  try {
    w.run(fn);
  } catch (const RankFailure& f) {
    EXPECT_LT(Clock::now() - t0, bound) << "the failure took too long to be reported";
    return f;
  }
  ADD_FAILURE() << "World::run did not throw";
  return RankFailure(-1, "", nullptr);
}

// The hang diagnosis of a watchdog failure, without the line of the rank that raised it (any
// blocked rank may be first to notice).
std::string watchdog_report(const RankFailure& f) {
  EXPECT_TRUE(cause_is<HangError>(f)) << f.what();
  const std::string d = without_times(f.diagnosis());
  const std::string head = "rank " + std::to_string(f.rank()) + " failed: ";
  EXPECT_EQ(d.rfind(head, 0), 0u) << d;
  return d.substr(head.size());
}

std::vector<float> ones(std::size_t n) {
  return std::vector<float>(n, 1.0f);
}

TEST(HangDiagnosis, MissingSendIsACycleOfTheReceiverAndTheCollectiveItNeverEntered) {
  World world(hang_options(4));
  RankFailure f = run_failing(world, [](Rank& r) {
    const int n = r.size();
    auto out = ones(16), in = ones(16);
    if (r.id() != 2) send<float>(r.comm(), out, (r.id() + 1) % n);  // rank 2 forgot its send
    recv<float>(r.comm(), in, (r.id() + n - 1) % n);
    std::vector<float> all(16 * static_cast<std::size_t>(n));
    all_gather<float>(r.comm(), in, all);
  });
  EXPECT_EQ(watchdog_report(f),
            "hang: no rank made progress for T s (watchdog_timeout T s); every rank is blocked "
            "or has returned\n"
            "pending operations:\n"
            "  rank 0: all_gather #1 on group world, 64 B, waiting T s for rank 3 to enter\n"
            "  rank 1: all_gather #1 on group world, 64 B, waiting T s for rank 3 to enter\n"
            "  rank 2: all_gather #1 on group world, 64 B, waiting T s for rank 3 to enter\n"
            "  rank 3: recv #1 from rank 2, 64 B, waiting T s for the message\n"
            "wait-for cycle: rank 2 waits in all_gather #1 on group world, which rank 3 never "
            "entered; rank 3 waits in recv #1 from rank 2");
  // The flight recorder shows what each rank did: rank 2 never sent, rank 3 was still receiving.
  const std::string& fr = f.flight_record();
  EXPECT_NE(fr.find("rank 2, 2 operations in this run:\n  recv #1 from rank 1 on group world"),
            std::string::npos)
      << fr;
  EXPECT_NE(fr.find("rank 3, 2 operations in this run:\n  send #1 to rank 0 on group world, 64 B "
                    "at "),
            std::string::npos)
      << fr;
  EXPECT_NE(fr.find("\n  recv #1 from rank 2 on group world, 64 B at "), std::string::npos) << fr;
  EXPECT_NE(fr.find("ms, failed\n"), std::string::npos) << fr;
  EXPECT_NE(std::string(f.what()).find("last operations of each rank"), std::string::npos);
  world.run([](Rank& r) { barrier(r.comm()); });  // usable again
}

TEST(HangDiagnosis, RingTurnedTheWrongWayOnOneRank) {
  World world(hang_options(4));
  RankFailure f = run_failing(world, [](Rank& r) {
    const int n = r.size();
    // 4 KiB messages: not copied eagerly, so each send waits for its receiver.
    auto out = ones(1024), in = ones(1024);
    int to = (r.id() + 1) % n, from = (r.id() + n - 1) % n;
    if (r.id() == 1) std::swap(to, from);  // rank 1 turns the ring the other way
    sendrecv<float>(r.comm(), out, to, in, from);
    barrier(r.comm());
  });
  EXPECT_EQ(watchdog_report(f),
            "hang: no rank made progress for T s (watchdog_timeout T s); every rank is blocked "
            "or has returned\n"
            "pending operations:\n"
            "  rank 0: send #1 to rank 1, waiting T s for the receiver to copy\n"
            "  rank 1: recv #1 from rank 2, 4.00 KiB, waiting T s for the message\n"
            "  rank 2: recv #1 from rank 1, 4.00 KiB, waiting T s for the message\n"
            "  rank 3: barrier #1 on group world, waiting T s for rank 0 to enter\n"
            "wait-for cycle: rank 1 waits in recv #1 from rank 2; rank 2 waits in recv #1 from "
            "rank 1");
}

TEST(HangDiagnosis, BranchTakenByOneRankOnly) {
  World world(hang_options(4));
  RankFailure f = run_failing(world, [](Rank& r) {
    Comm pair = r.comm().split(r.id() / 2, r.id(), "pair" + std::to_string(r.id() / 2));
    auto x = ones(16);
    if (r.id() == 0) barrier(pair);  // only rank 0 takes this branch
    if (pair.rank() == 0)
      send<float>(pair, x, 1);
    else
      recv<float>(pair, x, 0);
    barrier(r.comm());
  });
  EXPECT_EQ(watchdog_report(f),
            "hang: no rank made progress for T s (watchdog_timeout T s); every rank is blocked "
            "or has returned\n"
            "pending operations:\n"
            "  rank 0: barrier #1 on group pair0, waiting T s for rank 1 to enter\n"
            "  rank 1: recv #1 from rank 0 on group pair0, 64 B, waiting T s for the message\n"
            "  rank 2: barrier #2 on group world, waiting T s for rank 0 to enter\n"
            "  rank 3: barrier #2 on group world, waiting T s for rank 0 to enter\n"
            "wait-for cycle: rank 0 waits in barrier #1 on group pair0, which rank 1 never "
            "entered; rank 1 waits in recv #1 from rank 0 on group pair0");
}

TEST(HangDiagnosis, MismatchedSizesAreNamedOnBothSides) {
  World world(hang_options(4));
  // A message and a collective whose sizes disagree: a mismatch at once, not a hang.
  RankFailure p2p = run_failing(
      world,
      [](Rank& r) {
        std::vector<float> a(r.id() == 0 ? 100 : 50);
        if (r.id() == 0) send<float>(r.comm(), a, 1);
        if (r.id() == 1) recv<float>(r.comm(), a, 0);
      },
      1s);
  EXPECT_TRUE(cause_is<CollectiveMismatch>(p2p));
  EXPECT_EQ(p2p.diagnosis(),
            "rank 1 failed: recv #1 on group world: rank 0 sent count=100 float, rank 1 expects "
            "count=50 float");
  RankFailure coll = run_failing(
      world,
      [](Rank& r) {
        const std::size_t c = r.id() == 2 ? 2048 : 4096;
        std::vector<float> a(c), b(4 * c);
        all_gather<float>(r.comm(), a, b);
      },
      1s);
  EXPECT_TRUE(cause_is<CollectiveMismatch>(coll));
  EXPECT_EQ(coll.diagnosis().substr(coll.diagnosis().find(':')),
            ": collective #1 on group world: rank 2 called all_gather(count=2048, float) while "
            "ranks 0-1, 3 called all_gather(count=4096, float)");
}

TEST(HangDiagnosis, RankReturningEarlyIsNamedWithEveryPendingOperation) {
  World world(hang_options(3));
  RankFailure f = run_failing(
      world,
      [](Rank& r) {
        auto x = ones(16);
        if (r.id() == 2) return;  // returns before its part of the schedule
        all_reduce<float>(r.comm(), std::span<float>(x));
      },
      1s);
  ASSERT_TRUE(cause_is<HangError>(f)) << f.what();
  const std::string d = f.diagnosis();
  const std::string r = std::to_string(f.rank());
  // The first line is exact; the others list each rank, which may still be on its way.
  const std::string first = "rank " + r + " failed: rank " + r +
                            " waits in all_reduce #1 (64 B) on group world (awaiting every member "
                            "to enter) for world rank 2, which already returned from its run "
                            "function\npending operations:\n";
  EXPECT_EQ(d.substr(0, first.size()), first);
  EXPECT_NE(d.find("  rank 2: returned from its run function"), std::string::npos) << d;
}

TEST(HangDiagnosis, PerWaitTimeoutStillReportsARankBusyOutsideTheRuntime) {
  // Rank 1 never communicates (a compute loop that never ends): it is not blocked, so the
  // watchdog stays quiet, and the per-wait hang_timeout reports the waiting rank.
  World world({.ranks = 2, .hang_timeout = 300ms, .watchdog_timeout = 100ms});
  std::atomic<bool> stop{false};
  RankFailure f = run_failing(world, [&](Rank& r) {
    if (r.id() == 1) {
      // relaxed: only a flag to end the loop; it orders nothing.
      while (!stop.load(std::memory_order_relaxed)) std::this_thread::sleep_for(1ms);
      return;
    }
    struct Stop {
      std::atomic<bool>& s;
      ~Stop() { s.store(true, std::memory_order_relaxed); }  // relaxed: see the load above
    } stop_on_exit{stop};
    barrier(r.comm());
  });
  ASSERT_TRUE(cause_is<HangError>(f)) << f.what();
  EXPECT_EQ(f.rank(), 0);
  EXPECT_EQ(without_times(f.diagnosis()),
            "rank 0 failed: rank 0 made no progress for T s in barrier #1 on group world "
            "(awaiting every member to enter), waiting for world rank 1\n"
            "pending operations:\n"
            "  rank 0: barrier #1 on group world, waiting T s for rank 1 to enter\n"
            "  rank 1: running (in no wait)");
}

TEST(HangDiagnosis, DiagnosisReachesStderrWhileARankIsStillBusyOutsideTheRuntime) {
  // Rank 1 computes until it reads the diagnosis from stderr (a pipe here), or gives up after
  // 10 s: World::run cannot return before it does, so only a diagnosis printed when it was made
  // lets it stop early.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(fds[1], 2);
  World world({.ranks = 2, .hang_timeout = 300ms, .watchdog_timeout = 100ms});
  std::string seen;
  const auto t0 = Clock::now();
  try {
    world.run([&](Rank& r) {
      if (r.id() == 0) {
        barrier(r.comm());
        return;
      }
      char buf[4096];
      while (seen.find("made no progress") == std::string::npos && Clock::now() - t0 < 10s) {
        const ssize_t k = ::read(fds[0], buf, sizeof buf);
        if (k > 0) seen.append(buf, static_cast<std::size_t>(k));
        std::this_thread::sleep_for(5ms);
      }
    });
    ADD_FAILURE() << "World::run did not throw";
  } catch (const RankFailure& f) {
    EXPECT_TRUE(cause_is<HangError>(f)) << f.what();
  }
  const auto took = Clock::now() - t0;
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_NE(seen.find("tspemu: rank 0 made no progress for"), std::string::npos) << seen;
  EXPECT_LT(took, 5s) << "the busy rank never saw the diagnosis";
}

TEST(HangDiagnosis, FlightRecorderKeepsTheLastOperationsOfEachRankOnly) {
  World world({.ranks = 2, .watchdog_timeout = kWatchdog, .flight_recorder_depth = 4});
  RankFailure f = run_failing(world, [](Rank& r) {
    std::vector<float> x(8, 1.0f);
    for (int i = 0; i < 10; ++i) all_reduce<float>(r.comm(), std::span<float>(x));
    if (r.id() == 1) throw std::runtime_error("stop here");
    barrier(r.comm());
  });
  const std::string fr = f.flight_record();
  // Depth 4: rank 1 keeps all_reduce #7..#10, rank 0 all_reduce #8..#10 and its barrier.
  EXPECT_EQ(fr.find("all_reduce #6"), std::string::npos) << fr;
  for (int i = 7; i <= 10; ++i)
    EXPECT_NE(fr.find("all_reduce #" + std::to_string(i) + " on group world, 32 B"),
              std::string::npos)
        << fr;
  EXPECT_NE(fr.find("rank 1, 10 operations in this run:"), std::string::npos) << fr;
  EXPECT_NE(fr.find("rank 0, 11 operations in this run:"), std::string::npos) << fr;
  EXPECT_NE(fr.find("barrier #11 on group world at"), std::string::npos) << fr;
  EXPECT_NE(fr.find(", failed"), std::string::npos) << fr;  // rank 0's barrier, aborted
}

// The number a flight record prints after `key` ("at " or "took ") for `what` in `rank`'s part.
double recorded_ms(const std::string& record, int rank, const std::string& what,
                   const std::string& key) {
  const std::size_t part = record.find("rank " + std::to_string(rank) + ", ");
  const std::size_t op = record.find(what, part);
  const std::size_t at = record.find(key, op);
  if (part == std::string::npos || op == std::string::npos || at == std::string::npos) return -1;
  return std::stod(record.substr(at + key.size()));
}

TEST(HangDiagnosis, FlightRecordTimesAWaitingOperationAndNotesAPromptSmallOneAsTakingNoTime) {
  World world({.ranks = 2, .flight_recorder_depth = 8});
  // Root 1 enters 30 ms after rank 0 is about to enter: rank 0 waits for it; the eager root
  // itself never waits. The flag, not a bare sleep, keeps a slow thread start (ThreadSanitizer
  // beside another test program) from shortening the wait.
  std::atomic<bool> rank0_entering{false};
  RankFailure f = run_failing(world, [&](Rank& r) {
    std::vector<float> x(2, 1.0f);
    if (r.id() == 0) {
      // release/acquire: only orders this flag; the broadcast synchronises the data itself.
      rank0_entering.store(true, std::memory_order_release);
    } else {
      while (!rank0_entering.load(std::memory_order_acquire)) std::this_thread::yield();
      std::this_thread::sleep_for(30ms);
    }
    broadcast<float>(r.comm(), std::span<float>(x), 1);
    if (r.id() == 1) throw std::runtime_error("stop here");
    barrier(r.comm());
  });
  const std::string fr = f.flight_record();
  const std::string op = "broadcast #1 root 1";
  // Rank 0 cannot finish before the root enters: its time covers the root's lateness, which
  // the records' own start times give whatever the scheduler did (0.002 ms: print rounding).
  const double lateness = recorded_ms(fr, 1, op, " at ") - recorded_ms(fr, 0, op, " at ");
  EXPECT_GT(lateness, 5.0) << fr;
  EXPECT_GE(recorded_ms(fr, 0, op, "took "), lateness - 0.002) << fr;
  EXPECT_EQ(recorded_ms(fr, 1, op, "took "), 0.0) << fr;
}

// An unobserved 8 B broadcast takes the eager short path (Call::eager_broadcast): its receivers
// waiting for a root that never enters are still each diagnosed as pending in that broadcast,
// with the cycle through the root and a failed record in the flight recorder.
TEST(HangDiagnosis, ReceiversOfAnEagerBroadcastWhoseRootNeverEntersArePendingInIt) {
  World world(hang_options(3));
  RankFailure f = run_failing(world, [](Rank& r) {
    std::vector<double> x(1, 1.0), in(1);
    if (r.id() == 2) recv<double>(r.comm(), in, 1);  // the root waits for a message never sent
    broadcast<double>(r.comm(), std::span<double>(x), 2);
  });
  EXPECT_EQ(watchdog_report(f),
            "hang: no rank made progress for T s (watchdog_timeout T s); every rank is blocked "
            "or has returned\n"
            "pending operations:\n"
            "  rank 0: broadcast #1 on group world, 8 B, waiting T s for rank 2 to enter\n"
            "  rank 1: broadcast #1 on group world, 8 B, waiting T s for rank 2 to enter\n"
            "  rank 2: recv #1 from rank 1, 8 B, waiting T s for the message\n"
            "wait-for cycle: rank 1 waits in broadcast #1 on group world, which rank 2 never "
            "entered; rank 2 waits in recv #1 from rank 1");
  const std::string& fr = f.flight_record();
  EXPECT_NE(fr.find("rank 0, 1 operations in this run:\n  broadcast #1 root 2 on group world, 8 B"),
            std::string::npos)
      << fr;
  EXPECT_NE(fr.find("ms, failed\n"), std::string::npos) << fr;
  world.run([](Rank& r) {  // usable again, on the short path
    std::vector<double> x(1, r.id() == 2 ? 4.0 : 0.0);
    broadcast<double>(r.comm(), std::span<double>(x), 2);
    EXPECT_EQ(x[0], 4.0) << "rank " << r.id();
  });
}

// Rank 1 computes (here: waits for a flag, in no runtime operation) while rank 0 waits for it in
// a barrier: after stuck_rank_timeout the run fails naming rank 1, without waiting for it. The
// flag, not a sleep, decides when rank 1 returns: the test lets it go once run() has failed.
WorldOptions stuck_options(int ranks) {
  return {
      .ranks = ranks, .hang_timeout = 20s, .watchdog_timeout = 100ms, .stuck_rank_timeout = 200ms};
}

// Rank `stuck` loops outside the runtime until `go` is set; every other rank enters a barrier.
// The flag is shared, not on the test's stack: the stuck rank may read it after the test's World
// is gone (the run function's copy holds it).
std::function<void(Rank&)> stuck_rank_schedule(int stuck,
                                               const std::shared_ptr<std::atomic<bool>>& go) {
  return [stuck, go](Rank& r) {
    if (r.id() == stuck) {
      // acquire: pairs with the test's release store; only this flag is handed over.
      while (!go->load(std::memory_order_acquire)) std::this_thread::sleep_for(1ms);
      return;
    }
    barrier(r.comm());
  };
}

TEST(HangDiagnosis, RankStuckOutsideTheRuntimeIsNamedAndTheRunEndsWithoutIt) {
  const int before = thread_count();
  {
    World world(stuck_options(2));
    const auto go = std::make_shared<std::atomic<bool>>(false);
    RankFailure f = run_failing(world, stuck_rank_schedule(1, go));
    go->store(true, std::memory_order_release);  // release: pairs with the rank's acquire load
    ASSERT_TRUE(cause_is<HangError>(f)) << f.what();
    EXPECT_EQ(f.rank(), 1);
    EXPECT_EQ(without_times(f.diagnosis()),
              "rank 1 failed: rank 1 has not entered a collective for T s (stuck_rank_timeout "
              "T s); rank 0 waits in barrier #1 on group world\n"
              "pending operations:\n"
              "  rank 0: barrier #1 on group world, waiting T s for rank 1 to enter\n"
              "  rank 1: running (in no wait)");
    EXPECT_TRUE(contains(f.flight_record(), "\nrank 1: stuck in its run function"));
    EXPECT_TRUE(contains(f.flight_record(), "rank 0, 1 operations in this run:\n  barrier #1"));
    // The next run waits for rank 1 to return, then runs as usual.
    world.run([](Rank& r) { barrier(r.comm()); });
  }
  EXPECT_EQ(thread_count(), before);
}

TEST(HangDiagnosis, EveryRankWaitingForTheStuckRankIsNamed) {
  World world(stuck_options(3));
  const auto go = std::make_shared<std::atomic<bool>>(false);
  RankFailure f = run_failing(world, stuck_rank_schedule(0, go));
  go->store(true, std::memory_order_release);  // release: as above
  ASSERT_TRUE(cause_is<HangError>(f)) << f.what();
  EXPECT_EQ(f.rank(), 0);
  // The waiter that noticed is listed (its wait is published: it was parked); the other one is
  // too once its wait is published, which the test does not wait for.
  const std::string d = without_times(f.diagnosis());
  const std::string head =
      "rank 0 failed: rank 0 has not entered a collective for T s (stuck_rank_timeout T s)";
  EXPECT_EQ(d.substr(0, head.size()), head) << d;
  const std::string waits = " waits in barrier #1 on group world";
  EXPECT_TRUE(d.find("; rank 1" + waits) != std::string::npos ||
              d.find("; rank 2" + waits) != std::string::npos)
      << d;
  EXPECT_TRUE(contains(d, "\n  rank 0: running (in no wait)"));
  // Waits for rank 0 to return before `go` goes out of scope (it reads it until then).
  world.run([](Rank& r) { barrier(r.comm()); });
}

TEST(HangDiagnosis, RankEnteringOperationsOfAnotherGroupIsNotStuck) {
  // Rank 0 waits in the world barrier for ranks 1 and 2, which compute and reduce on their own
  // group for longer than the stuck bound in all, but enter an operation far more often.
  World world({.ranks = 3, .hang_timeout = 20s, .stuck_rank_timeout = 300ms});
  world.run([](Rank& r) {
    Comm pair = r.comm().split(r.id() == 0 ? 0 : 1, r.id(), r.id() == 0 ? "zero" : "pair");
    if (r.id() != 0) {
      std::vector<float> x(4, 1.0f);
      for (int i = 0; i < 8; ++i) {
        std::this_thread::sleep_for(60ms);  // compute, 5 times shorter than the bound
        all_reduce<float>(pair, std::span<float>(x));
      }
    }
    barrier(r.comm());
  });
}

TEST(HangDiagnosis, WorldDestroyedWhileARankIsStuckLeavesItsStateToTheStuckThread) {
  const int before = thread_count();
  const auto go = std::make_shared<std::atomic<bool>>(false);
  {
    World world(stuck_options(2));
    RankFailure f = run_failing(world, stuck_rank_schedule(1, go));
    EXPECT_EQ(f.rank(), 1);
  }  // returns although rank 1 is still in its run function
  go->store(true, std::memory_order_release);  // release: as above
  // Rank 1's thread frees the world's state and ends once it returns: wait for it (bounded).
  const auto deadline = Clock::now() + 10s;
  while (thread_count() != before && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(thread_count(), before);
}

TEST(HangDiagnosis, StuckRankTimeoutMustNotBeNegative) {
  try {
    World world({.ranks = 2, .stuck_rank_timeout = -1ms});
    ADD_FAILURE() << "a negative stuck_rank_timeout was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "World: stuck_rank_timeout must be positive, or 0 to disable it");
  }
}

}  // namespace
}  // namespace tspemu::test
