// A World spanning MPI processes (WorldOptions::mpi, runtime/transport/mpi.hpp), run under
// `mpirun -np P`: every process runs every test; each compares its own ranks' results.
//
// Bitwise equality with one process: each test runs the same schedule in a world spanning the
// processes and in a threads-only world of the same N inside this process, and compares the
// outputs of the ranks this process hosts bit for bit. Those inputs are deliberately inexact
// (1/(k+1)): a sum taken in another order would differ in its last bits, so the comparison checks
// the rank order of every reduction, not only the data movement; exact small-integer results are
// checked beside them.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/trace.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu {
namespace {

int processes() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

float inexact(int rank, std::size_t i, int salt) {
  return 1.0f / static_cast<float>(1 + rank * 131 + static_cast<int>(i % 1000) * 7 + salt * 3);
}

// One rank's outputs of every collective and its traffic counters, in a fixed order.
struct Outputs {
  std::vector<float> values;
  std::vector<std::uint64_t> counters;
};

// Every collective of the runtime on the world communicator and on two splits (one whose groups
// stay inside a process when N/P is even, one whose groups cross processes), at sizes on both
// sides of the eager limit and counts not divisible by N.
void every_collective(Rank& r, Outputs& out) {
  Comm& c = r.comm();
  const int n = c.size(), me = c.rank();
  auto vec = [&](std::size_t count, int salt) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = inexact(me, i, salt);
    return v;
  };
  auto keep = [&](const std::vector<float>& v) {
    out.values.insert(out.values.end(), v.begin(), v.end());
  };
  for (std::size_t count : {std::size_t{3}, std::size_t{70001}}) {
    auto x = vec(count, 1);
    all_reduce<float>(c, x);
    keep(x);
    auto s = vec(count * static_cast<std::size_t>(n), 2);
    std::vector<float> part(count);
    reduce_scatter<float>(c, s, part);
    keep(part);
    auto g = vec(count, 3);
    std::vector<float> all(count * static_cast<std::size_t>(n));
    all_gather<float>(c, g, all);
    keep(all);
    auto b = vec(count, 4);
    broadcast<float>(c, b, n - 1);
    keep(b);
    auto red = vec(count, 5);
    std::vector<float> sum(me == 1 ? count : 0);
    reduce<float>(c, red, sum, 1);
    keep(sum);
    auto a = vec(count * static_cast<std::size_t>(n), 6);
    std::vector<float> t(a.size());
    all_to_all<float>(c, a, t);
    keep(t);
    auto o = vec(count, 7);
    std::vector<float> in(count);
    sendrecv<float>(c, o, (me + 1) % n, in, (me + n - 1) % n);
    keep(in);
  }
  // Variable counts: rank q gives q + 1 elements.
  auto v = vec(static_cast<std::size_t>(me) + 1, 8);
  std::vector<float> gv(static_cast<std::size_t>(n * (n + 1) / 2));
  all_gatherv<float>(c, v, gv);
  keep(gv);
  // Two buffers reduced in one collective.
  auto b0 = vec(5, 9), b1 = vec(4099, 10);
  std::vector<std::span<float>> bufs{b0, b1};
  all_reduce_buffers<float>(c, std::span<const std::span<float>>(bufs));
  keep(b0);
  keep(b1);
  // The sequence <-> heads exchange (strided rows), there and back.
  const SequenceHeadsShape shape{2, 3, static_cast<std::size_t>(2 * n), 5};
  auto seq = vec(shape.B * shape.S_local * shape.H * shape.hs, 11);
  std::vector<float> heads(seq.size()), back(seq.size());
  all_to_all_sequence_to_heads<float>(c, seq, heads, shape);
  all_to_all_heads_to_sequence<float>(c, heads, back, shape);
  keep(heads);
  keep(back);
  barrier(c);
  // Groups within and across processes.
  for (int color_of : {0, 1}) {
    Comm sub = color_of == 0 ? c.split(me % 2, me) : c.split(me / 2, -me);
    auto x = vec(1000, 12 + color_of);
    all_reduce<float>(sub, x);
    keep(x);
    auto y = vec(2, 14);
    std::vector<float> ys(2 * static_cast<std::size_t>(sub.size()));
    all_gather<float>(sub, y, ys);
    keep(ys);
  }
  // Blocking point-to-point both ways round the ring, large and small.
  for (std::size_t count : {std::size_t{2}, std::size_t{30000}}) {
    auto m = vec(count, 15);
    std::vector<float> got(count);
    if (me % 2 == 0) {
      send<float>(c, m, (me + 1) % n);
      recv<float>(c, got, (me + n - 1) % n);
    } else {
      recv<float>(c, got, (me + n - 1) % n);
      send<float>(c, m, (me + 1) % n);
    }
    keep(got);
  }
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const auto& e = r.counters()[static_cast<CollectiveKind>(k)];
    out.counters.insert(out.counters.end(), {e.calls, e.bytes_sent, e.bytes_received});
  }
}

std::vector<Outputs> run_outputs(World& w, const std::function<void(Rank&, Outputs&)>& fn) {
  std::vector<Outputs> outs(static_cast<std::size_t>(w.size()));
  w.clear_counters();
  w.run([&](Rank& r) { fn(r, outs[static_cast<std::size_t>(r.id())]); });
  return outs;
}

WorldOptions across(int n) {
  return WorldOptions{.ranks = n, .hang_timeout = std::chrono::seconds(60), .mpi = true};
}

class MpiWorld : public ::testing::TestWithParam<int> {};

TEST_P(MpiWorld, EveryCollectiveIsBitwiseTheOneProcessResult) {
  const int n = GetParam();
  World spanning(across(n));
  World local(WorldOptions{.ranks = n});
  const auto got = run_outputs(spanning, every_collective);
  const auto want = run_outputs(local, every_collective);
  int hosted = 0;
  for (int r = 0; r < n; ++r) {
    if (!spanning.hosts(r)) continue;
    ++hosted;
    const auto& g = got[static_cast<std::size_t>(r)];
    const auto& e = want[static_cast<std::size_t>(r)];
    ASSERT_EQ(g.values.size(), e.values.size()) << "rank " << r;
    EXPECT_EQ(std::memcmp(g.values.data(), e.values.data(), g.values.size() * sizeof(float)), 0)
        << "rank " << r << ": outputs differ from the one-process run";
    EXPECT_EQ(g.counters, e.counters) << "rank " << r << ": traffic counters differ";
  }
  EXPECT_EQ(hosted, n / processes());
  // Every rank's counters reach every process at the end of the run.
  for (int r = 0; r < n; ++r)
    for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
      const auto kind = static_cast<CollectiveKind>(k);
      EXPECT_EQ(spanning.counters(r)[kind].bytes_received, local.counters(r)[kind].bytes_received)
          << "rank " << r << " " << collective_name(kind);
      EXPECT_EQ(spanning.counters(r)[kind].calls, local.counters(r)[kind].calls)
          << "rank " << r << " " << collective_name(kind);
    }
}

TEST_P(MpiWorld, AllReduceOfSmallIntegersIsExactOnEveryRank) {
  const int n = GetParam();
  World w(across(n));
  for (std::size_t count : {std::size_t{1}, std::size_t{64}, std::size_t{100003}}) {
    std::vector<int> wrong(static_cast<std::size_t>(n), 0);
    w.run([&](Rank& r) {
      std::vector<float> x(count);
      for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<float>((r.id() * 7 + i * 3) % 17);
      all_reduce<float>(r.comm(), x);
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += static_cast<float>((q * 7 + i * 3) % 17);
        if (x[i] != want) ++wrong[static_cast<std::size_t>(r.id())];
      }
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(wrong[static_cast<std::size_t>(r)], 0) << "rank " << r;
  }
}

// Large reductions across processes (mpi.hpp: recv_reduce): the ranges of members in other
// processes are copied, those of members in this process are summed in place, in group-rank
// order, a chunk of 64 KiB at a time (the next chunk's reads in flight while one is summed).
// Per-rank ranges of 64 Ki floats and around it, of one chunk and around it (16 Ki floats, 8 Ki
// doubles), counts not divisible by N, in place and out of place, with several ranks per process
// (N = 8 at P = 2, 4; N = 4 at P = 2) and one (N = 4 at P = 4): bitwise the threads-only result.
std::vector<Outputs> large_reductions(World& w) {
  constexpr std::size_t k64Ki = 65536, kChunkFloats = 16384;
  return run_outputs(w, [](Rank& r, Outputs& out) {
    Comm& c = r.comm();
    const auto n = static_cast<std::size_t>(c.size());
    auto vec = [&](std::size_t count, int salt) {
      std::vector<float> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = inexact(c.rank(), i * 7919 % 100003, salt);
      return v;
    };
    auto keep = [&](const std::vector<float>& v) {
      out.values.insert(out.values.end(), v.begin(), v.end());
    };
    for (const std::size_t per_rank :
         {kChunkFloats - 1, kChunkFloats, kChunkFloats + 1, 2 * kChunkFloats + 1, k64Ki - 1, k64Ki,
          k64Ki + 1, 3 * k64Ki + 5}) {
      auto x = vec(per_rank * n + n - 1, 1);  // not divisible by N
      all_reduce<float>(c, x);
      keep(x);
      const auto in = vec(per_rank * n, 2);
      std::vector<float> sum(in.size());
      all_reduce<float>(c, in, sum);
      keep(sum);
      std::vector<float> part(per_rank);
      reduce_scatter<float>(c, in, part);
      keep(part);
      // Doubles: a chunk is half as many elements.
      std::vector<double> d(per_rank / 2 * n + 1);
      for (std::size_t i = 0; i < d.size(); ++i) d[i] = 1.0 / static_cast<double>(3 + c.rank() + i);
      all_reduce<double>(c, d);
      const std::size_t at = out.values.size();  // the doubles' bits, compared as they are
      out.values.resize(at + d.size() * sizeof(double) / sizeof(float));
      std::memcpy(out.values.data() + at, d.data(), d.size() * sizeof(double));
    }
    // Sets of buffers: a step message made of pieces, which a process of the same node cannot
    // read in place (its owner's process answers so), read over MPI instead; reads of the
    // members' first-step messages (one buffer each) in place beside them.
    auto p0 = vec(3 * k64Ki + 1, 3), p1 = vec(5, 4), p2 = vec(kChunkFloats * n + 7, 5);
    const std::vector<std::span<float>> set{p0, p1, p2};
    all_reduce_buffers<float>(c, std::span<const std::span<float>>(set));
    for (const auto* v : {&p0, &p1, &p2}) keep(*v);
    auto q0 = vec(k64Ki * n, 6), q1 = vec(3 * n, 7), q2 = vec(kChunkFloats * n, 8);
    const std::vector<std::span<float>> blocks{q0, q1, q2};
    reduce_scatter_buffers<float>(c, std::span<const std::span<float>>(blocks));
    for (const auto* v : {&q0, &q1, &q2}) keep(*v);
  });
}

TEST_P(MpiWorld, LargeReductionsSumLocalRangesInPlaceBitwiseAsOneProcess) {
  const int n = GetParam();
  World spanning(across(n));
  World local(WorldOptions{.ranks = n});
  const auto got = large_reductions(spanning);
  const auto want = large_reductions(local);
  for (int r = 0; r < n; ++r) {
    if (!spanning.hosts(r)) continue;
    const auto& g = got[static_cast<std::size_t>(r)].values;
    const auto& e = want[static_cast<std::size_t>(r)].values;
    ASSERT_EQ(g.size(), e.size()) << "rank " << r;
    std::size_t first = 0;
    while (first < g.size() && std::memcmp(&g[first], &e[first], sizeof(float)) == 0) ++first;
    EXPECT_EQ(first, g.size()) << "rank " << r << ": first difference from the one-process run at "
                               << first << " of " << g.size();
  }
}

// The data path's two waiting modes (mpi.hpp: a rank thread polls MPI itself for a while, then
// parks and the progress thread serves): back-to-back calls of mixed sizes, once with every rank
// prompt and once with a different rank late by longer than the polling lasts at every call.
TEST_P(MpiWorld, BackToBackCallsStayExactWhetherPeersArePromptOrLate) {
  const int n = GetParam();
  World w(across(n));
  for (const auto late : {std::chrono::microseconds(0), std::chrono::microseconds(3000)}) {
    std::vector<int> wrong(static_cast<std::size_t>(n), 0);
    w.run([&](Rank& r) {
      for (int call = 0; call < 24; ++call) {
        if (late.count() > 0 && call % n == r.id()) std::this_thread::sleep_for(late);
        const std::size_t count = call % 3 == 0 ? 3 : call % 3 == 1 ? 40000 : 70;
        std::vector<float> x(count);
        for (std::size_t i = 0; i < count; ++i)
          x[i] = static_cast<float>((r.id() * 5 + static_cast<int>(i) + call) % 13);
        all_reduce<float>(r.comm(), x);
        std::vector<float> b(count, static_cast<float>(r.id()));
        broadcast<float>(r.comm(), b, call % n);
        for (std::size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int q = 0; q < n; ++q)
            want += static_cast<float>((q * 5 + static_cast<int>(i) + call) % 13);
          if (x[i] != want || b[i] != static_cast<float>(call % n))
            ++wrong[static_cast<std::size_t>(r.id())];
        }
      }
    });
    for (int r = 0; r < n; ++r) {
      if (!w.hosts(r)) continue;
      EXPECT_EQ(wrong[static_cast<std::size_t>(r)], 0)
          << "rank " << r << ", late by " << late.count() << " us";
    }
  }
}

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
    const std::string m = e.diagnosis();
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
  for (int r = 0; r < n; ++r)
    if (w.hosts(r)) {
      EXPECT_EQ(sums[static_cast<std::size_t>(r)], static_cast<float>(n * (n - 1) / 2));
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
    const std::string m = e.diagnosis();
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
    const std::string m = e.diagnosis();
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
    const std::string m = e.diagnosis();
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
    const std::string m = e.diagnosis();
    EXPECT_NE(m.find("collective #53 on group world: rank " + std::to_string(n - 1) +
                     " called broadcast(count=2, float, root=" + std::to_string(n - 1) +
                     ") while ranks 0-" + std::to_string(n - 2) +
                     " called broadcast(count=2, float, root=0)"),
              std::string::npos)
        << m;
    EXPECT_THROW(std::rethrow_exception(e.cause()), CollectiveMismatch);
  }
}

// Runs of small broadcasts longer than a receiver holds its opens and than the mailbox's
// descriptor ring, roots in every process, and messages between processes in the middle (a
// receiver that parks waiting for one first sends what it held).
TEST_P(MpiWorld, LongRunsOfSmallBroadcastsWithMessagesBetweenStayExact) {
  const int n = GetParam();
  World w(across(n));
  std::vector<int> wrong(static_cast<std::size_t>(n), 0);
  w.run([&](Rank& r) {
    for (int call = 0; call < 300; ++call) {
      const int root = call < 150 ? 0 : (call / 7) % n;
      std::vector<float> b(2, static_cast<float>(r.id() == root ? call : -1));
      broadcast<float>(r.comm(), b, root);
      if (b[0] != static_cast<float>(call) || b[1] != static_cast<float>(call))
        ++wrong[static_cast<std::size_t>(r.id())];
      if (call == 100 || call == 220) {
        // The last rank waits for rank 0's message, sent after rank 0 ran ahead.
        std::vector<float> m(4, static_cast<float>(call));
        if (r.id() == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          send<float>(r.comm(), m, n - 1);
        } else if (r.id() == n - 1) {
          std::vector<float> in(4);
          recv<float>(r.comm(), in, 0);
          if (in != m) ++wrong[static_cast<std::size_t>(r.id())];
        }
      }
    }
  });
  for (int r = 0; r < n; ++r)
    if (w.hosts(r)) {
      EXPECT_EQ(wrong[static_cast<std::size_t>(r)], 0) << "rank " << r;
    }
}

// Control messages travel on two tags (mpi/wire.hpp): those of at most kPostedBytes (2 KiB) into
// receives posted in advance, longer ones probed for. A point-to-point message above that size,
// sent between small collectives whose opens take the other tag, still arrives whole and in its
// pair's order, and the collectives' results stay exact.
TEST_P(MpiWorld, MessagesAboveThePostedReceiveSizeBetweenSmallCollectivesStayExact) {
  const int n = GetParam();
  World w(across(n));
  std::vector<int> wrong(static_cast<std::size_t>(n), 0);
  w.run([&](Rank& r) {
    const int to = (r.id() + 1) % n, from = (r.id() + n - 1) % n;
    for (int call = 0; call < 20; ++call) {
      // 600 floats (2400 B, the large tag) on even calls, 3 floats (the posted one) on odd ones.
      const std::size_t count = call % 2 == 0 ? 600 : 3;
      std::vector<float> out(count), in(count);
      for (std::size_t i = 0; i < count; ++i)
        out[i] = static_cast<float>(r.id() * 1000 + call * 7 + static_cast<int>(i % 5));
      SendHandle sent = isend<float>(r.comm(), out, to);
      std::vector<float> x(2, static_cast<float>(r.id() + call));
      all_reduce<float>(r.comm(), x);
      recv<float>(r.comm(), in, from);
      sent.wait();
      const float sum = static_cast<float>(n * (n - 1) / 2 + n * call);
      if (x[0] != sum || x[1] != sum) ++wrong[static_cast<std::size_t>(r.id())];
      for (std::size_t i = 0; i < count; ++i)
        if (in[i] != static_cast<float>(from * 1000 + call * 7 + static_cast<int>(i % 5)))
          ++wrong[static_cast<std::size_t>(r.id())];
    }
  });
  for (int r = 0; r < n; ++r)
    if (w.hosts(r)) {
      EXPECT_EQ(wrong[static_cast<std::size_t>(r)], 0) << "rank " << r;
    }
}

// Control messages between processes of one node go through rings (mpi/rings.hpp: ControlRing) when
// the node's processes fit its cores or TSPEMU_MPI_CONTROL_RINGS=1; ctest also runs every test with
// rings of 4 KiB (TSPEMU_MPI_CONTROL_RING_BYTES). 300 messages of 1 KiB to a rank that first sleeps
// are many such rings' worth: a writer that finds its ring full waits for the reader's process to
// take records out, and every message arrives whole and in its pair's order.
TEST_P(MpiWorld, MessagesBeyondAControlRingsRoomWaitForTheReaderAndArriveInOrder) {
  const int n = GetParam();
  World w(across(n));
  constexpr int kMessages = 300;
  constexpr std::size_t kCount = 256;
  std::vector<int> wrong(static_cast<std::size_t>(n), 0);
  w.run([&](Rank& r) {
    const int last = n - 1;
    if (r.id() == 0) {
      std::vector<std::vector<float>> out(kMessages, std::vector<float>(kCount));
      std::vector<SendHandle> sent;
      for (int m = 0; m < kMessages; ++m) {
        for (std::size_t i = 0; i < kCount; ++i)
          out[static_cast<std::size_t>(m)][i] = static_cast<float>(m * 1000 + static_cast<int>(i));
        sent.push_back(isend<float>(r.comm(), out[static_cast<std::size_t>(m)], last));
      }
      for (SendHandle& h : sent) h.wait();
    } else if (r.id() == last) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::vector<float> in(kCount);
      for (int m = 0; m < kMessages; ++m) {
        recv<float>(r.comm(), in, 0);
        for (std::size_t i = 0; i < kCount; ++i)
          if (in[i] != static_cast<float>(m * 1000 + static_cast<int>(i)))
            ++wrong[static_cast<std::size_t>(r.id())];
      }
    }
    std::vector<float> x(1, 1.0f);
    all_reduce<float>(r.comm(), x);
    if (x[0] != static_cast<float>(n)) ++wrong[static_cast<std::size_t>(r.id())];
  });
  for (int r = 0; r < n; ++r)
    if (w.hosts(r)) {
      EXPECT_EQ(wrong[static_cast<std::size_t>(r)], 0) << "rank " << r;
    }
}

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
    const std::string m = e.diagnosis();
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
    const std::string m = e.diagnosis();
    EXPECT_EQ(e.rank(), 0) << m;
    EXPECT_NE(m.find("unreceived message: rank 0 sent message #1 (64 B) to rank " +
                     std::to_string(n - 1)),
              std::string::npos)
        << m;
    EXPECT_THROW(std::rethrow_exception(e.cause()), CollectiveMismatch);
  }
  w.run([&](Rank& r) { barrier(r.comm()); });  // the next run starts clean
}

TEST_P(MpiWorld, WorldMadeAfterOneEndedByAFailureIsBitwiseTheOneProcessResult) {
  const int n = GetParam();
  {
    // Large reads in flight when the last rank throws: their replies and the dones may still be
    // on the wire when this world ends; none may reach the next world's communicator.
    World failed(across(n));
    EXPECT_THROW(failed.run([&](Rank& r) {
      std::vector<float> x(300000, 1.0f);
      if (r.id() == n - 1) throw std::runtime_error("injected");
      all_reduce<float>(r.comm(), x);
    }),
                 RankFailure);
  }
  for (int round = 0; round < 3; ++round) {
    World spanning(across(n));
    World local(WorldOptions{.ranks = n});
    const auto got = run_outputs(spanning, every_collective);
    const auto want = run_outputs(local, every_collective);
    for (int r = 0; r < n; ++r)
      if (spanning.hosts(r)) {
        const auto& g = got[static_cast<std::size_t>(r)].values;
        const auto& e = want[static_cast<std::size_t>(r)].values;
        ASSERT_EQ(g.size(), e.size());
        EXPECT_EQ(std::memcmp(g.data(), e.data(), g.size() * sizeof(float)), 0)
            << "round " << round << " rank " << r;
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

INSTANTIATE_TEST_SUITE_P(Ranks, MpiWorld, ::testing::Values(4, 8),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

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
}  // namespace tspemu

// MPI is initialized here, before any test asks for the process count; the worlds then use it.
int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  MPI_Finalize();
  return failed;
}
