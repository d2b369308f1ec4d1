// Control and point-to-point messages between MPI processes (runtime/transport/mpi/wire.hpp,
// rings.hpp): long runs of small broadcasts with messages between, messages above the posted
// receive size, and more messages than a control ring holds all arrive whole and in order.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "mpi_world.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::test {
namespace {

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
      const int ids = n * (n - 1) / 2;  // 0 + 1 + ... + n-1, a whole number
      const float sum = static_cast<float>(ids + n * call);
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

}  // namespace
}  // namespace tspemu::test
