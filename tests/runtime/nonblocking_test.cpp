// Non-blocking collectives (nonblocking.hpp): bitwise the blocking forms' results at several world
// sizes and counts, several outstanding and waited in any order, mismatches with the blocking form
// named, failures propagated to waiters, and user errors (a handle never waited, a buffer written
// before the wait) reported, not silent.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.hpp"
#include "tspemu/core/compute_span.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/nonblocking.hpp"
#include "tspemu/runtime/sim_clock.hpp"

namespace tspemu::test {
namespace {

// Every non-blocking form against its blocking form on the same inputs, bit for bit; counts below
// and above the one-step (256-byte) paths and not divisible by the group size.
template <class T>
void check_against_blocking(Comm& c, std::size_t count, const char* tn) {
  const int n = c.size(), me = c.rank();
  const auto nc = static_cast<std::size_t>(n);
  const int root = n - 1;
  const auto mine = values<T>(me, count, 1);
  const auto wide = values<T>(me, nc * count, 2);

  std::vector<T> bb = me == root ? mine : std::vector<T>(count, T(99)), ib = bb;
  broadcast<T>(c, bb, root);
  CollectiveHandle hb = ibroadcast<T>(c, ib, root);
  std::vector<T> bg(nc * count), ig(nc * count);
  all_gather<T>(c, mine, bg);
  CollectiveHandle hg = iall_gather<T>(c, mine, ig);
  std::vector<T> brs(count), irs(count);
  reduce_scatter<T>(c, wide, brs);
  CollectiveHandle hrs = ireduce_scatter<T>(c, wide, irs);
  std::vector<T> bar(count), iar(count), iar_in_place = mine;
  all_reduce<T>(c, mine, bar);
  CollectiveHandle har = iall_reduce<T>(c, mine, iar);
  CollectiveHandle har2 = iall_reduce<T>(c, std::span<T>(iar_in_place));
  std::vector<T> br(me == root ? count : 0), ir(br.size());
  reduce<T>(c, mine, br, root);
  CollectiveHandle hr = ireduce<T>(c, mine, ir, root);
  // The blocking calls between the issues ran the pending ones first (issue order on the Comm).
  EXPECT_TRUE(hb.done() && hg.done() && hrs.done() && har.done());
  EXPECT_FALSE(hr.done());
  hr.wait();
  har2.wait();
  har.wait();
  hrs.wait();
  hg.wait();
  hb.wait();
  same<T>(ib, bb, ctx("ibroadcast", c, count, tn));
  same<T>(ig, bg, ctx("iall_gather", c, count, tn));
  same<T>(irs, brs, ctx("ireduce_scatter", c, count, tn));
  same<T>(iar, bar, ctx("iall_reduce", c, count, tn));
  same<T>(iar_in_place, bar, ctx("iall_reduce", c, count, tn, "in place"));
  same<T>(ir, br, ctx("ireduce", c, count, tn));
  // And the exact values (small integers: exact in any order).
  same<T>(iar, sum_values<T>(n, 0, count, 1), ctx("iall_reduce exact", c, count, tn));
}

TEST(NonBlocking, ResultsAreBitwiseTheBlockingFormsAt2To8Ranks) {
  for (int n : {2, 3, 4, 8}) {
    World& w = shared_world(n);
    w.run([](Rank& r) {
      for (std::size_t count : {0u, 1u, 7u, 61u, 1000u}) {
        check_against_blocking<float>(r.comm(), count, "float");
        check_against_blocking<double>(r.comm(), count, "double");
        check_against_blocking<std::int32_t>(r.comm(), count, "i32");
      }
    });
  }
}

TEST(NonBlocking, SeveralOutstandingWaitedInAnyOrderOnEachRank) {
  for (int n : {2, 3, 4, 8}) {
    World& w = shared_world(n);
    w.run([](Rank& r) {
      Comm& c = r.comm();
      const int n = c.size(), me = c.rank();
      const std::size_t count = 300;
      std::vector<std::vector<float>> sums(4, std::vector<float>(count));
      std::vector<std::vector<float>> inputs;
      inputs.reserve(4);
      for (int k = 0; k < 4; ++k) inputs.push_back(values<float>(me, count, k));
      std::vector<float> gathered(static_cast<std::size_t>(n) * count);
      std::vector<CollectiveHandle> hs;
      hs.reserve(5);
      for (int k = 0; k < 4; ++k) hs.push_back(iall_reduce<float>(c, inputs[k], sums[k]));
      hs.push_back(iall_gather<float>(c, inputs[0], gathered));
      // Each rank waits in its own order: rank r starts at handle r mod 5, then goes backwards.
      for (int i = 0; i < 5; ++i) {
        const int k = ((me - i) % 5 + 5) % 5;
        hs[static_cast<std::size_t>(k)].wait();
        EXPECT_TRUE(hs[static_cast<std::size_t>(k)].done());
      }
      for (int k = 0; k < 4; ++k)
        same<float>(sums[static_cast<std::size_t>(k)], sum_values<float>(n, 0, count, k),
                    ctx("iall_reduce", c, count, "float", std::to_string(k).c_str()));
      for (int q = 0; q < n; ++q)
        same<float>(
            std::span<const float>(gathered).subspan(static_cast<std::size_t>(q) * count, count),
            values<float>(q, count, 0), ctx("iall_gather", c, count, "float"));
    });
  }
}

TEST(NonBlocking, CountersAreTheBlockingForms) {
  World& w = shared_world(4);
  w.run([](Rank& r) {
    const std::size_t count = 100;
    std::vector<float> send = values<float>(r.id(), count, 0), recv(4 * count);
    CounterProbe p(r, CollectiveKind::all_gather);
    iall_gather<float>(r.comm(), send, recv).wait();
    p.expect(expected_traffic(CollectiveKind::all_gather, 4, r.id(), -1, count * sizeof(float),
                              sizeof(float)),
             "iall_gather counters");
  });
}

TEST(NonBlocking, MismatchWithTheBlockingFormNamesBoth) {
  World& w = shared_world(2);
  const RankFailure f = expect_failure(w, [](Rank& r) {
    std::vector<float> send(4, 1.0f), recv(8);
    if (r.id() == 0)
      iall_gather<float>(r.comm(), send, recv).wait();
    else
      all_gather<float>(r.comm(), send, recv);
  });
  EXPECT_TRUE(contains(f.what(), "rank 0 called iall_gather(count=4"));
  EXPECT_TRUE(contains(f.what(), "rank 1 called all_gather(count=4"));
  EXPECT_TRUE(contains(f.what(), "collective #1"));
}

TEST(NonBlocking, ARankThatThrowsWakesTheWaitersWithItsFailure) {
  World& w = shared_world(4);
  std::vector<std::string> seen(4);
  const RankFailure f = expect_failure(w, [&](Rank& r) {
    std::vector<float> buf(1000, 1.0f);
    CollectiveHandle h = iall_reduce<float>(r.comm(), std::span<float>(buf));
    if (r.id() == 2) throw std::runtime_error("rank 2 gave up");
    try {
      h.wait();
    } catch (const PeerFailure& e) {
      seen[static_cast<std::size_t>(r.id())] = e.what();
      throw;
    }
  });
  EXPECT_EQ(f.rank(), 2);
  EXPECT_TRUE(contains(f.what(), "rank 2 gave up"));
  for (int r : {0, 1, 3}) EXPECT_TRUE(contains(seen[static_cast<std::size_t>(r)], "rank 2"));
}

TEST(NonBlocking, AHandleNeverWaitedFailsTheRankNamingTheOperation) {
  World& w = shared_world(2);
  // Reported when the run function returns.
  RankFailure f = expect_failure(w, [](Rank& r) {
    std::vector<float> buf(16, 1.0f);
    CollectiveHandle h = iall_reduce<float>(r.comm(), std::span<float>(buf));
    if (r.id() == 0) h.wait();
  });
  EXPECT_EQ(f.rank(), 1);
  EXPECT_TRUE(contains(f.what(), "iall_reduce #1 on group world"));
  EXPECT_TRUE(contains(f.what(), "destroyed without wait()"));
  // Reported at the rank's next collective, before it opens.
  f = expect_failure(w, [](Rank& r) {
    std::vector<float> buf(16, 1.0f), out(32);
    { CollectiveHandle dropped = iall_gather<float>(r.comm(), buf, out); }
    barrier(r.comm());
  });
  EXPECT_TRUE(contains(f.what(), "iall_gather #1"));
  EXPECT_TRUE(contains(f.what(), "destroyed without wait()"));
  w.run([](Rank& r) { check_all_reduce<float>(r, r.comm(), 100, "float"); });  // still usable
}

TEST(NonBlocking, ABufferWrittenBeforeTheWaitIsReported) {
  World& w = shared_world(2);
  const RankFailure f = expect_failure(w, [](Rank& r) {
    std::vector<float> send(1000, 1.0f), recv(1000);
    CollectiveHandle h = iall_reduce<float>(r.comm(), send, recv);
    barrier(r.comm());  // runs it: no error, the buffers were untouched
    CollectiveHandle h2 = iall_reduce<float>(r.comm(), send, recv);
    if (r.id() == 1) send[999] = 2.0f;
    h2.wait();
    h.wait();
  });
  EXPECT_EQ(f.rank(), 1);
  EXPECT_TRUE(contains(f.what(), "iall_reduce #3 on group world"));
  EXPECT_TRUE(contains(f.what(), "buffers changed between the issue and the wait"));
}

// Buffers above the digest's whole-buffer size (16 KiB) are sampled; the documented rule says a
// change to a buffer's first or last 64 bytes, or a rewrite of all of it, is always caught.
TEST(NonBlocking, ALargeBufferWrittenAtItsEndsOrWhollyBeforeTheWaitIsReported) {
  World& w = shared_world(2);
  const std::size_t count = std::size_t{1} << 18;  // 1 MiB send, 2 MiB receive buffer
  enum class Write { kSendFirst, kRecvLast, kSendWhole };
  for (Write what : {Write::kSendFirst, Write::kRecvLast, Write::kSendWhole}) {
    SCOPED_TRACE(static_cast<int>(what));
    const RankFailure f = expect_failure(w, [&](Rank& r) {
      std::vector<float> send(count, 1.0f), recv(2 * count, 0.0f);
      CollectiveHandle h = iall_gather<float>(r.comm(), send, recv);
      if (r.id() == 0) {
        if (what == Write::kSendFirst) send.front() = 2.0f;
        if (what == Write::kRecvLast) recv.back() = 3.0f;
        if (what == Write::kSendWhole) std::fill(send.begin(), send.end(), 4.0f);
      }
      h.wait();
    });
    EXPECT_EQ(f.rank(), 0);
    EXPECT_TRUE(contains(f.what(), "iall_gather #1 on group world"));
    EXPECT_TRUE(contains(f.what(), "buffers changed between the issue and the wait"));
  }
  w.run([](Rank& r) { check_all_reduce<float>(r, r.comm(), 100, "float"); });  // still usable
}

TEST(NonBlocking, OnSplitGroupsBesideTheWorld) {
  World& w = shared_world(4);
  w.run([](Rank& r) {
    Comm half = r.comm().split(r.id() % 2, r.id());
    std::vector<float> a = values<float>(r.id(), 50, 0), sa(50);
    std::vector<float> b = values<float>(half.rank(), 50, 1), sb(50);
    CollectiveHandle hw = iall_reduce<float>(r.comm(), a, sa);
    CollectiveHandle hh = iall_reduce<float>(half, b, sb);
    hh.wait();
    hw.wait();
    same<float>(sa, sum_values<float>(4, 0, 50, 0), "world");
    same<float>(sb, sum_values<float>(2, 0, 50, 1), "half");
  });
}

// Early exposure (runtime/transport/early_exposure.hpp): a rank that computes after issuing lets
// the members that wait first copy blocks of its all_gather; "compute" here is a ComputeSpan
// around a sleep, the kernel boundary the exposure keys on.
void compute_for(std::chrono::microseconds t) {
  ComputeSpan span("skew");
  std::this_thread::sleep_for(t);
}

// Skew both ways (each rank in turn computes while the others wait), in-place and separate
// receive buffers, two operations outstanding and waited in reverse order: every result is the
// exact gather, and the counters are the blocking form's.
TEST(NonBlocking, IallGatherFilledEarlyByWaitingMembersIsExactWithSkewEitherWay) {
  for (int n : {2, 3}) {
    World& w = shared_world(n);
    w.run([n](Rank& r) {
      const auto nc = static_cast<std::size_t>(n);
      const std::size_t count = 1031;  // 4124 bytes: above the mailbox size, a prime
      const int iterations = kUnderTsan ? 12 : 40;
      CounterProbe p(r, CollectiveKind::all_gather);
      for (int it = 0; it < iterations; ++it) {
        const std::vector<float> mine = values<float>(r.id(), count, it);
        std::vector<float> want(nc * count);
        for (int q = 0; q < n; ++q) {
          const std::vector<float> theirs = values<float>(q, count, it);
          std::copy(theirs.begin(), theirs.end(), want.begin() + static_cast<long>(q * count));
        }
        std::vector<float> recv(nc * count, -100.0f), in_place(nc * count, -100.0f);
        std::copy(mine.begin(), mine.end(), in_place.begin() + static_cast<long>(r.id() * count));
        const std::span<const float> own(in_place.data() + r.id() * count, count);
        CollectiveHandle a = iall_gather<float>(r.comm(), mine, recv);
        CollectiveHandle b = iall_gather<float>(r.comm(), own, in_place);
        if (r.id() == it % n) compute_for(std::chrono::microseconds(300 + 100 * (it % 3)));
        b.wait();
        a.wait();
        const std::string where = "n=" + std::to_string(n) + " it=" + std::to_string(it);
        same<float>(recv, want, ctx("iall_gather skewed", r.comm(), count, "float", where.c_str()));
        same<float>(in_place, want,
                    ctx("iall_gather skewed", r.comm(), count, "float", "in place"));
      }
      const auto calls = 2 * static_cast<std::uint64_t>(iterations);
      const Traffic one =
          expected_traffic(CollectiveKind::all_gather, nc, static_cast<std::size_t>(r.id()), -1,
                           count * sizeof(float), sizeof(float));
      p.expect({one.sent * calls, one.received * calls}, "iall_gather counters, skewed", calls);
    });
  }
}

// A rank that throws while a member copies into its buffers: the member's copy ends before the
// rank's handle is gone (the rank then owns its buffers again: a sentinel written over them in
// the handler survives, where a late copy would overwrite it and ThreadSanitizer would report the
// race), the member fails with PeerFailure instead of hanging, and the world stays usable.
TEST(NonBlocking, ARankThatThrowsWhileAMemberFillsItsBuffersIsNotWrittenAfterItUnwinds) {
  World& w = shared_world(2);
  constexpr std::size_t kCount = std::size_t{1} << 18;  // 1 MiB blocks: copies take a while
  for (int delay_us : {0, 30, 60, 100, 150, 250, 400, 1000}) {
    SCOPED_TRACE(delay_us);
    std::atomic<bool> waiting{false};
    bool intact = false;
    const RankFailure f = expect_failure(w, [&](Rank& r) {
      if (r.id() == 1) {
        std::vector<float> send(kCount, 1.0f), recv(2 * kCount, 0.0f);
        try {
          CollectiveHandle h = iall_gather<float>(r.comm(), send, recv);
          ComputeSpan span("compute");
          // acquire: pairs with rank 0's release store just before its wait.
          while (!waiting.load(std::memory_order_acquire)) std::this_thread::yield();
          std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
          throw std::runtime_error("rank 1 failed while computing");
        } catch (const std::runtime_error&) {
          std::fill(recv.begin(), recv.end(), -7.0f);
          std::this_thread::sleep_for(std::chrono::milliseconds(2));  // time for a late copy
          intact = std::all_of(recv.begin(), recv.end(), [](float v) { return v == -7.0f; });
          throw;
        }
      }
      std::vector<float> send(kCount, 2.0f), recv(2 * kCount);
      CollectiveHandle h = iall_gather<float>(r.comm(), send, recv);
      waiting.store(true, std::memory_order_release);
      h.wait();
    });
    EXPECT_EQ(f.rank(), 1);
    EXPECT_TRUE(contains(f.what(), "rank 1 failed while computing"));
    EXPECT_TRUE(intact);
  }
  w.run([](Rank& r) { check_all_reduce<float>(r, r.comm(), 100, "float"); });  // still usable
}

// Members copy nothing into a member whose operation differs: the mismatch is the meet's, named as
// without early exposure, and the computing member's receive buffer is untouched.
TEST(NonBlocking, AMismatchedIallGatherIsReportedByTheMeetAndNothingIsWrittenIntoThePeer) {
  World& w = shared_world(2);
  bool untouched = false;
  std::atomic<bool> computing{false};
  const RankFailure f = expect_failure(w, [&](Rank& r) {
    const std::size_t count = r.id() == 0 ? 1000 : 2000;
    std::vector<float> send(count, 1.0f), recv(2 * count, -1.0f);
    CollectiveHandle h = iall_gather<float>(r.comm(), send, recv);
    if (r.id() == 1) {
      ComputeSpan span("compute");
      computing.store(true, std::memory_order_release);  // pairs with rank 0's acquire load
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      while (!computing.load(std::memory_order_acquire)) std::this_thread::yield();
    }
    try {
      h.wait();
    } catch (const std::exception&) {
      if (r.id() == 1)
        untouched = std::all_of(recv.begin(), recv.end(), [](float v) { return v == -1.0f; });
      throw;
    }
  });
  EXPECT_TRUE(contains(f.what(), "iall_gather(count=1000"));
  EXPECT_TRUE(contains(f.what(), "iall_gather(count=2000"));
  EXPECT_TRUE(untouched);
}

// A receive block written after the issue but before the issuer's compute is left by the member
// that would fill it early, so the issuer's digest check still reports it.
TEST(NonBlocking, AReceiveBlockWrittenBeforeTheIssuersComputeIsReportedThoughAMemberWaits) {
  World& w = shared_world(2);
  const std::size_t count = std::size_t{1} << 16;
  std::atomic<bool> computing{false};
  const RankFailure f = expect_failure(w, [&](Rank& r) {
    std::vector<float> send(count, 1.0f), recv(2 * count, 0.0f);
    CollectiveHandle h = iall_gather<float>(r.comm(), send, recv);
    if (r.id() == 1) {
      recv.front() = 5.0f;  // rank 0's block, which rank 0 would push while rank 1 computes
      ComputeSpan span("compute");
      computing.store(true, std::memory_order_release);  // pairs with rank 0's acquire load
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      while (!computing.load(std::memory_order_acquire)) std::this_thread::yield();
    }
    h.wait();
  });
  EXPECT_EQ(f.rank(), 1);
  EXPECT_TRUE(contains(f.what(), "iall_gather #1 on group world"));
  EXPECT_TRUE(contains(f.what(), "buffers changed between the issue and the wait"));
}

// The simulated clock: a transfer issued before compute and waited after it is hidden by it.
TEST(NonBlocking, SimulatedClockCountsTheTransferUnderComputeAsOverlapped) {
  SimClockModel m = SimClockModel::mi300x_if();
  World w({.ranks = 2, .sim_clock = m});
  const std::size_t count = std::size_t{1} << 20;  // 4 MiB
  w.run([&](Rank& r) {
    std::vector<float> send(count, 1.0f), recv(2 * count);
    CollectiveHandle h = iall_gather<float>(r.comm(), send, recv);
    { ComputeSpan gemm("gemm", 1e12); }  // ~1 ms at the preset's peak: longer than the transfer
    h.wait();
  });
  for (int r = 0; r < 2; ++r) {
    const World::SimulatedTime t = w.simulated_time(r);
    EXPECT_GT(t.overlapped_comm, 0) << "rank " << r;
    EXPECT_EQ(t.exposed_comm, 0) << "rank " << r;
    EXPECT_GT(t.compute, t.overlapped_comm) << "rank " << r;
  }
  // The blocking form exposes all of it.
  World wb({.ranks = 2, .sim_clock = m});
  wb.run([&](Rank& r) {
    std::vector<float> send(count, 1.0f), recv(2 * count);
    all_gather<float>(r.comm(), send, recv);
    { ComputeSpan gemm("gemm", 1e12); }
  });
  EXPECT_GT(wb.simulated_time(0).exposed_comm, 0);
  EXPECT_EQ(wb.simulated_time(0).overlapped_comm, 0);
}

}  // namespace
}  // namespace tspemu::test
