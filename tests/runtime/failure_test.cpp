// Failures: a throwing rank, mismatched calls, departed ranks, hangs, OOM and bad arguments are
// errors with names, reported within a second, never hangs; the world stays usable.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Boom : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A world stays usable: a correct all_reduce after a failed run.
void expect_usable(World& w) {
  w.run([](Rank& r) { check_all_reduce<float>(r, r.comm(), 1000, "float"); });
}

using Call = std::function<void(Rank&, std::vector<float>&, std::vector<float>&)>;
struct Kind {
  const char* name;
  Call call;
};

std::vector<Kind> kinds() {
  // Buffers sized for any n: a is n·count, b is n·count.
  return {
      {"broadcast", [](Rank& r, auto& a, auto&) { broadcast<float>(r.comm(), a, r.size() - 1); }},
      {"all_gather",
       [](Rank& r, auto& a, auto& b) {
         all_gather<float>(r.comm(), std::span(a).first(a.size() / r.size()), b);
       }},
      {"all_gatherv",
       [](Rank& r, auto& a, auto& b) {
         all_gatherv<float>(r.comm(), std::span(a).first(a.size() / r.size()), b);
       }},
      {"reduce_scatter",
       [](Rank& r, auto& a, auto& b) {
         reduce_scatter<float>(r.comm(), a, std::span(b).first(b.size() / r.size()));
       }},
      {"all_reduce", [](Rank& r, auto& a, auto& b) { all_reduce<float>(r.comm(), a, b); }},
      {"reduce", [](Rank& r, auto& a, auto& b) { reduce<float>(r.comm(), a, b, 1 % r.size()); }},
      {"all_to_all", [](Rank& r, auto& a, auto& b) { all_to_all<float>(r.comm(), a, b); }},
      {"barrier", [](Rank& r, auto&, auto&) { barrier(r.comm()); }},
      {"sendrecv",
       [](Rank& r, auto& a, auto& b) {
         sendrecv<float>(r.comm(), a, (r.id() + 1) % r.size(), b,
                         (r.id() + r.size() - 1) % r.size());
       }},
      {"isend/irecv",
       [](Rank& r, auto& a, auto& b) {
         auto s = isend<float>(r.comm(), a, (r.id() + 1) % r.size());
         auto q = irecv<float>(r.comm(), b, (r.id() + r.size() - 1) % r.size());
         q.wait();
         s.wait();
       }},
  };
}

enum class Where { before, inside, after };
const char* where_name(Where w) {
  return w == Where::before ? "before" : w == Where::inside ? "inside" : "after";
}

TEST(Failure, RankThrowingAroundEachCollectiveIsReportedWithItsRankWithinOneSecond) {
  const int n = quick() ? 3 : 4;
  World& world = shared_world(n);
  for (const Kind& k : kinds())
    for (Where where : {Where::before, Where::inside, Where::after})
      for (int f = 0; f < n; ++f)
        for (std::size_t count : {std::size_t{7}, std::size_t{1000}}) {
          SCOPED_TRACE(std::string(k.name) + " " + where_name(where) + " rank " +
                       std::to_string(f) + " count " + std::to_string(count));
          std::vector<std::string> peer_errors(static_cast<std::size_t>(n));
          Clock::duration took{};
          RankFailure e = expect_failure(
              world,
              [&](Rank& r) {
                std::vector<float> a(count * n, 1.0f), b(count * n);
                const bool me = r.id() == f;
                try {
                  if (me && where == Where::before) throw Boom("boom from " + std::to_string(f));
                  k.call(r, a, b);
                  if (me && where == Where::inside) throw Boom("boom from " + std::to_string(f));
                  k.call(r, a, b);
                  if (me && where == Where::after) throw Boom("boom from " + std::to_string(f));
                } catch (const PeerFailure& p) {
                  peer_errors[static_cast<std::size_t>(r.id())] = p.what();
                  throw;
                }
              },
              &took);
          EXPECT_EQ(e.rank(), f);
          EXPECT_TRUE(contains(e.what(), "rank " + std::to_string(f) + " failed"));
          EXPECT_TRUE(contains(e.what(), "boom from " + std::to_string(f)));
          EXPECT_TRUE(cause_is<Boom>(e));
          EXPECT_LT(took, 1s);
          // A collective the failing rank never entered fails on every other rank, except an
          // eager broadcast (at most 256 bytes): its root returns once its payload is published
          // and each receiver waits for the root alone, so they learn of the failure at their next
          // call that meets the group or at the end of their run (outside this function); the run
          // still fails naming the failing rank, as checked above.
          const bool collective = std::string(k.name).find("send") == std::string::npos;
          const bool eager_broadcast =
              std::string(k.name) == "broadcast" && count * sizeof(float) <= 256;
          for (int r = 0; r < n; ++r) {
            const auto& pe = peer_errors[static_cast<std::size_t>(r)];
            if (collective && !eager_broadcast && where != Where::after && r != f) {
              EXPECT_FALSE(pe.empty()) << "rank " << r << " did not fail with PeerFailure";
            }
            if (!pe.empty()) {
              EXPECT_TRUE(contains(pe, "rank " + std::to_string(f) + " failed first"));
              EXPECT_TRUE(contains(pe, "boom from"));
            }
          }
        }
  expect_usable(world);
}

// Runs a mismatched call on 4 ranks (rank 2 differs); every rank must throw CollectiveMismatch.
void expect_mismatch(const std::function<void(Rank&)>& fn, const std::vector<std::string>& parts) {
  World& world = shared_world(4);
  std::atomic<int> mismatches{0};
  Clock::duration took{};
  RankFailure e = expect_failure(
      world,
      [&](Rank& r) {
        try {
          fn(r);
        } catch (const CollectiveMismatch& m) {
          ++mismatches;
          for (const auto& p : parts) EXPECT_TRUE(contains(m.what(), p));
          throw;
        }
      },
      &took);
  EXPECT_TRUE(cause_is<CollectiveMismatch>(e)) << e.what();
  EXPECT_EQ(mismatches.load(), 4);
  for (const auto& p : parts) EXPECT_TRUE(contains(e.what(), p));
  EXPECT_LT(took, 1s);
  expect_usable(world);
}

TEST(Failure, MismatchedKindIsReportedWithBothCalls) {
  expect_mismatch(
      [](Rank& r) {
        std::vector<float> a(8), b(32);
        if (r.id() == 2)
          all_reduce<float>(r.comm(), a, std::span(b).first(8));
        else
          all_gather<float>(r.comm(), a, b);
      },
      {"collective #1 on group world: rank 2 called all_reduce(count=8, float) while ranks 0-1, 3 "
       "called all_gather(count=8, float)"});
}

// The headline names the deviating rank, even when it is rank 0, and the call the others made.
TEST(Failure, MismatchWhereRankZeroDeviatesNamesRankZeroAlone) {
  expect_mismatch(
      [](Rank& r) {
        std::vector<float> a(8), b(32);
        if (r.id() == 0)
          broadcast<float>(r.comm(), std::span(b).first(8), 1);
        else
          all_gather<float>(r.comm(), a, b);
      },
      {"collective #1 on group world: rank 0 called broadcast(count=8, float, root=1) while ranks "
       "1-3 called all_gather(count=8, float)"});
}

// Without a majority no rank is blamed: the headline says how the ranks split.
TEST(Failure, MismatchSplitTwoAgainstTwoSaysSoAndNamesBothCalls) {
  expect_mismatch(
      [](Rank& r) {
        std::vector<float> a(r.id() % 2 == 0 ? 300 : 400, 1.0f);
        all_reduce<float>(r.comm(), std::span(a));
      },
      {"collective #1 on group world: ranks split 2/2: ranks 0, 2 called all_reduce(count=300, "
       "float), ranks 1, 3 called all_reduce(count=400, float)"});
}

// Two minorities: each is named with its call, then the majority's.
TEST(Failure, MismatchWithTwoDeviatingCallsNamesEachBeforeTheMajority) {
  expect_mismatch(
      [](Rank& r) {
        std::vector<float> a(r.id() == 1 ? 8 : 16), b(64);
        if (r.id() == 3)
          all_reduce<float>(r.comm(), std::span(a));
        else
          all_gather<float>(r.comm(), a, std::span(b).first(4 * a.size()));
      },
      {"collective #1 on group world: rank 1 called all_gather(count=8, float), rank 3 called "
       "all_reduce(count=16, float) while ranks 0, 2 called all_gather(count=16, float)"});
}

TEST(Failure, MismatchedCountIsReportedWithBothCalls) {
  expect_mismatch(
      [](Rank& r) {
        const std::size_t c = r.id() == 2 ? 2048 : 4096;
        std::vector<float> a(c), b(4 * c);
        all_gather<float>(r.comm(), a, b);
      },
      {"collective #1 on group world: rank 2 called all_gather(count=2048, float) while ranks 0-1, "
       "3 called all_gather(count=4096, float)"});
}

TEST(Failure, MismatchedRootIsReportedWithBothCalls) {
  expect_mismatch(
      [](Rank& r) {
        std::vector<double> a(100);
        broadcast<double>(r.comm(), a, r.id() == 2 ? 3 : 1);
      },
      {"collective #1 on group world: rank 2 called broadcast(count=100, double, root=3) while "
       "ranks 0-1, 3 called broadcast(count=100, double, root=1)"});
}

// An eager broadcast's root (payload of at most 256 bytes) returns without meeting the members;
// a root the others disagree with throws CollectiveMismatch at its next call on the group, the
// receivers at the broadcast itself, all with the same message.
TEST(Failure, MismatchedRootOfAnEagerBroadcastFailsOnEveryRankByItsNextCall) {
  expect_mismatch(
      [](Rank& r) {
        std::vector<float> a(2, 1.0f);
        broadcast<float>(r.comm(), a, r.id() < 2 ? 0 : 2);
        barrier(r.comm());
      },
      {"collective #1 on group world: ranks split 2/2: ranks 0-1 called broadcast(count=2, float, "
       "root=0), ranks 2-3 called broadcast(count=2, float, root=2)"});
}

// Every rank is a root in its own view, so no rank meets the others at the broadcast: the
// mismatch surfaces when the roots meet the members, at the end of their run.
TEST(Failure, EagerBroadcastWhoseEveryRankIsARootIsAMismatchAtTheEndOfTheRun) {
  World& world = shared_world(4);
  RankFailure e = expect_failure(world, [](Rank& r) {
    std::vector<float> a(2, static_cast<float>(r.id()));
    broadcast<float>(r.comm(), a, r.id());
  });
  EXPECT_TRUE(cause_is<CollectiveMismatch>(e)) << e.what();
  EXPECT_TRUE(contains(e.what(),
                       "collective #1 on group world: ranks split 1/1/1/1: rank 0 called "
                       "broadcast(count=2, float, root=0), rank 1 called broadcast(count=2, float, "
                       "root=1), rank 2 called broadcast(count=2, float, root=2), rank 3 called "
                       "broadcast(count=2, float, root=3)"))
      << e.what();
  expect_usable(world);
}

// Eager broadcasts are settled in batches (every call all members have entered, once the ring
// needs a descriptor back): a disagreement deep inside a run longer than the ring is still
// reported with its own call number, whichever batch it falls in.
TEST(Failure, MismatchInsideALongRunOfEagerBroadcastsNamesItsCall) {
  for (const int n : {2, 4}) {
    World& world = shared_world(n);
    RankFailure e = expect_failure(world, [](Rank& r) {
      std::vector<float> a(2, 1.0f);
      for (int i = 1; i <= 200; ++i) broadcast<float>(r.comm(), a, i == 70 ? r.id() : 0);
    });
    EXPECT_TRUE(cause_is<CollectiveMismatch>(e)) << e.what();
    EXPECT_TRUE(contains(e.what(), "collective #70 on group world: ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "rank 1 called broadcast(count=2, float, root=1)")) << e.what();
    expect_usable(world);
    // A receiver that disagrees with its root (a count) is caught at the call by the receiver
    // and when the root settles.
    e = expect_failure(world, [](Rank& r) {
      for (int i = 1; i <= 200; ++i) {
        std::vector<float> a(i == 70 && r.id() == 1 ? 3 : 2, 1.0f);
        broadcast<float>(r.comm(), a, 0);
      }
    });
    EXPECT_TRUE(cause_is<CollectiveMismatch>(e)) << e.what();
    EXPECT_TRUE(contains(e.what(), "collective #70 on group world: ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "rank 1 called broadcast(count=3, float, root=0)")) << e.what();
    expect_usable(world);
  }
}

TEST(Failure, MismatchedElementTypeIsReportedWithBothCalls) {
  expect_mismatch(
      [](Rank& r) {
        if (r.id() == 2) {
          std::vector<std::int32_t> a(10);
          all_reduce<std::int32_t>(r.comm(), std::span(a));
        } else {
          std::vector<float> a(10);
          all_reduce<float>(r.comm(), std::span(a));
        }
      },
      {"collective #1 on group world: rank 2 called all_reduce(count=10, int32) while ranks 0-1, 3 "
       "called all_reduce(count=10, float)"});
}

TEST(Failure, SplitCalledByOnlySomeRanksNamesTheSplitNotItsEncoding) {
  World& world = shared_world(4);
  RankFailure e = expect_failure(world, [](Rank& r) {
    if (r.id() < 2)
      r.comm().split(0, r.id());
    else
      barrier(r.comm());
  });
  EXPECT_TRUE(cause_is<CollectiveMismatch>(e)) << e.what();
  EXPECT_TRUE(contains(e.what(),
                       "collective #1 on group world: ranks split 2/2: ranks 0-1 called split, "
                       "ranks 2-3 called barrier"))
      << e.what();
  EXPECT_FALSE(contains(e.what(), "int64")) << e.what();
  expect_usable(world);
}

TEST(Failure, UnreceivedMessagesOfAnySizeAreReportedAtTheEndOfTheRun) {
  // 64 B goes eagerly (its sender never waits), 4 KiB by single copy (its sender waits for the
  // receiver): both are the same bug and must be reported, naming both ends.
  for (const std::size_t count : {std::size_t{16}, std::size_t{1024}}) {
    World& world = shared_world(3);
    RankFailure e = expect_failure(world, [count](Rank& r) {
      std::vector<float> a(count, 1.0f);
      if (r.id() == 1) send<float>(r.comm(), a, 2);
    });
    if (count == 16) {
      EXPECT_TRUE(cause_is<CollectiveMismatch>(e)) << e.what();
      EXPECT_EQ(e.rank(), 1);
      EXPECT_TRUE(contains(e.what(),
                           "unreceived message: rank 1 sent message #1 (64 B) to rank 2 "
                           "on group world, which rank 2 never received"));
    } else {
      EXPECT_TRUE(contains(e.what(), "world rank 2, which already returned")) << e.what();
    }
    expect_usable(world);
  }
}

TEST(Failure, UnreceivedMessageOnASubgroupNamesTheGroupAndWorldRanks) {
  World& world = shared_world(4);
  RankFailure e = expect_failure(world, [](Rank& r) {
    Comm odd = r.comm().split(r.id() % 2, r.id(), "odd");
    std::vector<float> a(4, 1.0f);
    if (r.id() == 3) send<float>(odd, a, 0);  // group rank 0 of {1, 3} is world rank 1
  });
  EXPECT_TRUE(cause_is<CollectiveMismatch>(e)) << e.what();
  EXPECT_TRUE(contains(e.what(),
                       "rank 3 sent message #1 (16 B) to rank 1 on group odd, which "
                       "rank 1 never received"))
      << e.what();
  expect_usable(world);
}

TEST(Failure, NestedRunOfTheSameWorldFailsAtOnceNamingTheMistake) {
  World& world = shared_world(2);
  Clock::duration took{};
  RankFailure e = expect_failure(
      world,
      [&world](Rank& r) {
        if (r.id() == 1) world.run([](Rank&) {});
        barrier(r.comm());
      },
      &took);
  EXPECT_EQ(e.rank(), 1);
  EXPECT_TRUE(cause_is<std::invalid_argument>(e)) << e.what();
  EXPECT_TRUE(contains(e.what(), "World::run called from inside a run function of the same world"));
  EXPECT_LT(took, 1s);
  expect_usable(world);
}

TEST(Failure, RankReturningEarlyIsAHangErrorNamingIt) {
  World& world = shared_world(4);
  Clock::duration took{};
  RankFailure e = expect_failure(
      world,
      [](Rank& r) {
        if (r.id() == 3) return;
        barrier(r.comm());
      },
      &took);
  EXPECT_TRUE(cause_is<HangError>(e)) << e.what();
  EXPECT_TRUE(contains(e.what(), "world rank 3, which already returned"));
  EXPECT_LT(took, 1s);
  expect_usable(world);
}

TEST(Failure, RecvCountDifferentFromSendIsAMismatch) {
  World& world = shared_world(2);
  RankFailure e = expect_failure(world, [](Rank& r) {
    std::vector<float> a(r.id() == 0 ? 100 : 50);
    if (r.id() == 0)
      send<float>(r.comm(), a, 1);
    else
      recv<float>(r.comm(), a, 0);
  });
  EXPECT_TRUE(cause_is<CollectiveMismatch>(e)) << e.what();
  EXPECT_EQ(e.rank(), 1);
  EXPECT_TRUE(contains(e.what(), "rank 0 sent count=100 float"));
  EXPECT_TRUE(contains(e.what(), "expects count=50 float"));
  expect_usable(world);
}

TEST(Failure, RanksWaitingOnDifferentGroupsHangAndReportIt) {
  World world({.ranks = 2, .hang_timeout = 300ms});
  Clock::duration took{};
  RankFailure e = expect_failure(
      world,
      [](Rank& r) {
        Comm sub = r.comm().split(0, r.id(), "sub");
        if (r.id() == 0)
          barrier(r.comm());
        else
          barrier(sub);
      },
      &took);
  EXPECT_TRUE(cause_is<HangError>(e)) << e.what();
  EXPECT_TRUE(contains(e.what(), "made no progress"));
  EXPECT_TRUE(contains(e.what(), "barrier #"));
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 2s);
  expect_usable(world);
}

TEST(Failure, SenderThrowingBeforeItsMessageIsReceivedFailsTheReceiver) {
  World& world = shared_world(2);
  for (std::size_t count : {std::size_t{7}, std::size_t{100000}}) {
    std::atomic<bool> receiver_failed{false};
    RankFailure e = expect_failure(world, [&](Rank& r) {
      if (r.id() == 0) {
        auto data = std::make_unique<std::vector<float>>(count, 1.0f);
        auto h = isend<float>(r.comm(), *data, 1);
        throw Boom("sender gives up");
      }
      std::this_thread::sleep_for(20ms);
      std::vector<float> in(count);
      try {
        recv<float>(r.comm(), in, 0);
      } catch (const Error&) {
        receiver_failed = true;
        throw;
      }
      // Small messages are copied eagerly at isend: the receiver may get them.
      EXPECT_LE(count * sizeof(float), 256u);
    });
    EXPECT_EQ(e.rank(), 0);
    EXPECT_TRUE(cause_is<Boom>(e));
    if (count * sizeof(float) > 256) {
      EXPECT_TRUE(receiver_failed.load());
    }
  }
  expect_usable(world);
}

TEST(Failure, OutOfMemoryNamesRankRequestCapacityUseAndCategories) {
  World world({.ranks = 2, .arena_capacity = std::size_t{1} << 20});
  RankFailure e = expect_failure(world, [](Rank& r) {
    auto w = r.arena().allocate<std::byte>(512 << 10, Category::weights);
    auto kv = r.arena().allocate<std::byte>(256 << 10, Category::kv);
    auto ws = r.arena().allocate<std::byte>(64 << 10, Category::workspace);
    barrier(r.comm());
    if (r.id() == 1) auto more = r.arena().allocate<float>(128 << 10, Category::activations);
    barrier(r.comm());
  });
  EXPECT_EQ(e.rank(), 1);
  EXPECT_TRUE(cause_is<OutOfMemory>(e));
  const std::string m = e.what();
  for (const char* part :
       {"rank 1", "allocating 512.00 KiB for activations", "capacity 1.00 MiB", "in use 832.00 KiB",
        "weights 512.00 KiB", "kv 256.00 KiB", "workspace 64.00 KiB"})
    EXPECT_TRUE(contains(m, part));
}

template <class F>
void expect_invalid(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    for (const auto& p : parts) EXPECT_TRUE(contains(e.what(), p));
  }
}

TEST(Failure, BadArgumentsAreInvalidArgumentWithClearMessages) {
  World& world = shared_world(3);
  world.run([](Rank& r) {
    Comm& c = r.comm();
    std::vector<float> a(12), b(12);
    expect_invalid([&] { broadcast<float>(c, a, 3); },
                   {"broadcast", "root 3 is outside", "3 ranks"});
    expect_invalid([&] { broadcast<float>(c, a, -1); }, {"root -1"});
    expect_invalid([&] { reduce<float>(c, a, b, 5); }, {"reduce", "root 5 is outside"});
    expect_invalid([&] { all_gather<float>(c, std::span(a).first(4), std::span(b).first(11)); },
                   {"all_gather", "recv has 11 elements, needs 12"});
    expect_invalid([&] { reduce_scatter<float>(c, std::span(a).first(11), std::span(b).first(4)); },
                   {"reduce_scatter", "send has 11 elements, needs 12"});
    expect_invalid([&] { all_reduce<float>(c, a, std::span(b).first(11)); },
                   {"all_reduce", "recv has 11 elements, needs 12"});
    expect_invalid([&] { all_to_all<float>(c, std::span(a).first(10), std::span(b).first(10)); },
                   {"all_to_all", "not a multiple"});
    // Overlaps.
    std::span<float> s(a);
    expect_invalid([&] { all_to_all<float>(c, s.first(6), s.subspan(3, 6)); }, {"overlap"});
    expect_invalid([&] { all_reduce<float>(c, s.first(6), s.subspan(2, 6)); }, {"overlap"});
    expect_invalid([&] { all_gather<float>(c, s.subspan(1, 3), s.first(9)); },
                   {"overlaps recv but is not this rank's block"});
    expect_invalid([&] { reduce_scatter<float>(c, s.first(9), s.subspan(1, 3)); },
                   {"overlaps send but is not this rank's block"});
    expect_invalid([&] { sendrecv<float>(c, s.first(6), 0, s.subspan(3, 6), 0); }, {"overlap"});
    expect_invalid([&] { send<float>(c, a, 7); }, {"send", "peer 7 is outside"});
    expect_invalid([&] { recv<float>(c, a, -2); }, {"recv", "peer -2 is outside"});
    // A rank that is in no group (negative color) holds an invalid Comm.
    Comm none = c.split(r.id() == 1 ? -1 : 0, 0);
    if (r.id() == 1) {
      EXPECT_FALSE(none.valid());
      expect_invalid([&] { barrier(none); }, {"barrier", "invalid Comm"});
      expect_invalid([&] { all_reduce<float>(none, std::span(a)); },
                     {"all_reduce", "invalid Comm"});
      expect_invalid([&] { broadcast<float>(none, a, 0); }, {"invalid Comm"});
      expect_invalid([&] { send<float>(none, a, 0); }, {"invalid Comm"});
      expect_invalid([&] { (void)none.split(0, 0); }, {"invalid Comm"});
    } else {
      EXPECT_EQ(none.size(), 2);
      barrier(none);
    }
    barrier(c);  // the bad calls touched no mailbox: the world is still in step
  });
  expect_invalid([] { World w({.ranks = 0}); }, {"ranks=0"});
  expect_invalid([] { World w({.ranks = kMaxRanks + 1}); }, {"ranks=257"});
  expect_invalid([] { World w({.ranks = 2, .hang_timeout = 0ms}); }, {"hang_timeout"});
}

}  // namespace
}  // namespace tspemu::test

namespace tspemu::test {
namespace {

// A rank unwinding past an unwaited irecv must not wait for a message its peer will never send
// (the peer is waiting for it): the run fails at once, naming the throwing rank.
TEST(Failure, RankUnwindingPastAPendingIrecvIsReportedAtOnce) {
  World world({.ranks = 3, .hang_timeout = std::chrono::seconds(5)});
  for (std::size_t count : {std::size_t{7}, std::size_t{1000}}) {
    Clock::duration took{};
    RankFailure e = expect_failure(
        world,
        [&](Rank& r) {
          std::vector<float> in(count), out(count, 1.0f);
          if (r.id() == 0) {
            auto h = irecv<float>(r.comm(), in, 1);
            throw Boom("unwinding past an irecv");
          }
          barrier(r.comm());  // rank 1 sends only after the barrier rank 0 never enters
          if (r.id() == 1) send<float>(r.comm(), out, 0);
        },
        &took);
    EXPECT_EQ(e.rank(), 0);
    EXPECT_TRUE(cause_is<Boom>(e)) << e.what();
    EXPECT_LT(took, 1s);
  }
  expect_usable(world);
}

TEST(Failure, AllGathervWithAWrongRecvSizeIsInvalidArgumentNamingTheCounts) {
  World& world = shared_world(3);
  RankFailure e = expect_failure(world, [](Rank& r) {
    std::vector<float> send(static_cast<std::size_t>(r.id() + 1)), recv(5);  // needs 1+2+3
    all_gatherv<float>(r.comm(), send, recv);
  });
  EXPECT_TRUE(cause_is<std::invalid_argument>(e)) << e.what();
  EXPECT_TRUE(contains(e.what(), "recv has 5 elements, the ranks' counts (1, 2, 3) sum to 6"));
  expect_usable(world);
}

TEST(Failure, AllGathervWithSendOverlappingAnotherBlockIsInvalidArgument) {
  World& world = shared_world(3);
  RankFailure e = expect_failure(world, [](Rank& r) {
    std::vector<float> recv(300);
    std::span<float> all(recv);
    // Rank 1's block is [100, 200); it passes [50, 150).
    all_gatherv<float>(r.comm(), all.subspan(r.id() == 1 ? 50 : 100 * r.id(), 100), all);
  });
  EXPECT_TRUE(cause_is<std::invalid_argument>(e)) << e.what();
  EXPECT_EQ(e.rank(), 1);
  EXPECT_TRUE(contains(e.what(), "send overlaps recv but is not this rank's block"));
  expect_usable(world);
}

}  // namespace
}  // namespace tspemu::test
