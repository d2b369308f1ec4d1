// A World spanning MPI processes gives bitwise the one-process result (mpi_world.hpp): every
// collective on the world and on splits within and across processes, large reductions summed in
// place a chunk at a time, back-to-back calls with prompt and late peers, and a world made after
// one a failure ended; exact small-integer results are checked beside them.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "mpi_world.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::test {
namespace {

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
      for (std::size_t i = 0; i < count; ++i)
        x[i] = static_cast<float>((static_cast<std::size_t>(r.id()) * 7 + i * 3) % 17);
      all_reduce<float>(r.comm(), x);
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q)
          want += static_cast<float>((static_cast<std::size_t>(q) * 7 + i * 3) % 17);
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

}  // namespace
}  // namespace tspemu::test
