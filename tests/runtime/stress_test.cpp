// Randomized stress and determinism: random collective sequences on random groups with random
// per-rank delays, checked against sequential models; reductions of non-exact floats are bitwise
// identical run to run and equal to a left fold in rank order.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "collective_checks.hpp"

namespace tspemu::test {
namespace {

// Random per-rank jitter: mostly nothing, sometimes a yield, rarely a short sleep.
void jitter(std::mt19937_64& rng) {
  const auto x = rng() % 16;
  if (x == 0)
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
  else if (x < 4)
    std::this_thread::yield();
}

enum class Op {
  broadcast,
  all_gather,
  all_gatherv,
  reduce_scatter,
  all_reduce,
  reduce,
  all_to_all,
  p2p,
  barrier,
  count
};

template <class T>
void run_op(Op op, Rank& r, Comm& c, std::size_t count, const char* tn) {
  switch (op) {
    case Op::broadcast:
      return check_broadcast<T>(r, c, count, tn);
    case Op::all_gather:
      return check_all_gather<T>(r, c, count, tn);
    case Op::all_gatherv:
      return check_all_gatherv<T>(r, c, count, tn);
    case Op::reduce_scatter:
      return check_reduce_scatter<T>(r, c, count, tn);
    case Op::all_reduce:
      return check_all_reduce<T>(r, c, count, tn);
    case Op::reduce:
      return check_reduce<T>(r, c, count, tn);
    case Op::all_to_all:
      return check_all_to_all<T>(r, c, count, tn);
    case Op::p2p:
      return check_p2p<T>(r, c, count, tn);
    case Op::barrier:
      return check_barrier(r, c);
    case Op::count:
      break;
  }
}

void stress(int n, int sequences, int ops_per_sequence) {
  World& world = shared_world(n);
  const std::pair<int, int> mesh = mesh_of(n);
  const int mt = mesh.first, ms = mesh.second;
  const std::size_t counts[] = {0, 1, 3, 7, 16, 63, 64, 65, 300, 1000, 4099};
  for (int seq = 0; seq < sequences; seq += 10) {
    // Ten sequences per run: each rank derives the same op stream from the shared seed.
    world.run([&](Rank& r) {
      Mesh m = split_mesh(r, mt, ms);
      std::mt19937_64 delays(static_cast<std::uint64_t>(seq) * 1000 + r.id());
      for (int s = seq; s < seq + 10 && s < sequences; ++s) {
        std::mt19937_64 rng(static_cast<std::uint64_t>(s) * 7919 + n);
        for (int i = 0; i < ops_per_sequence; ++i) {
          const Op op = static_cast<Op>(rng() % static_cast<std::uint64_t>(Op::count));
          const auto g = rng() % 3;
          Comm& c = g == 0 ? r.comm() : g == 1 ? m.row : m.col;
          const std::size_t count = counts[rng() % std::size(counts)];
          const auto t = rng() % 4;
          jitter(delays);
          if (t == 0)
            run_op<float>(op, r, c, count, "float");
          else if (t == 1)
            run_op<double>(op, r, c, count, "double");
          else if (t == 2)
            run_op<std::int32_t>(op, r, c, count, "int32");
          else
            run_op<std::int64_t>(op, r, c, count, "int64");
        }
      }
    });
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(Stress, RandomSequencesOnRandomGroupsMatchTheSequentialModel8Ranks) {
  stress(8, quick() ? 200 : 2000, 6);
}

TEST(Stress, RandomSequencesOnRandomGroupsMatchTheSequentialModelOddSizes) {
  stress(6, quick() ? 60 : 500, 6);
  stress(9, quick() ? 60 : 500, 6);
  stress(5, quick() ? 60 : 500, 6);
}

// Determinism: random floats (sums not exact), n = 8, with random delays.
std::vector<float> random_floats(int rank, std::size_t count) {
  std::mt19937 rng(static_cast<unsigned>(rank) * 31 + 7);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& x : v) x = d(rng) * static_cast<float>(1 + rank % 5) * 1e3f;
  return v;
}

// Left fold in rank order: ((x_0 + x_1) + x_2) + ...
std::vector<float> left_fold(int n, std::size_t count) {
  std::vector<float> acc = random_floats(0, count);
  for (int r = 1; r < n; ++r) {
    auto x = random_floats(r, count);
    for (std::size_t i = 0; i < count; ++i) acc[i] += x[i];
  }
  return acc;
}

TEST(Determinism, AllReduceAndReduceScatterOfRandomFloatsAreBitwiseStableAndALeftFold) {
  const int n = 8;
  World& world = shared_world(n);
  const int runs = quick() ? 20 : 100;
  for (std::size_t count : {std::size_t{37}, std::size_t{1000}, std::size_t{40000}}) {
    const auto fold = left_fold(n, count);
    const auto fold_rs = left_fold(n, count * n);
    // The model itself must differ from other orders, or the test proves nothing.
    if (count == 1000) {
      auto rev = random_floats(n - 1, count);
      for (int r = n - 2; r >= 0; --r) {
        auto x = random_floats(r, count);
        for (std::size_t i = 0; i < count; ++i) rev[i] += x[i];
      }
      EXPECT_NE(std::memcmp(rev.data(), fold.data(), count * sizeof(float)), 0);
    }
    std::vector<std::vector<float>> first(n);
    for (int run = 0; run < runs; ++run) {
      world.run([&](Rank& r) {
        std::mt19937_64 delays(static_cast<std::uint64_t>(run) * 100 + r.id());
        const auto x = random_floats(r.id(), count);
        std::vector<float> y(count);
        jitter(delays);
        all_reduce<float>(r.comm(), x, y);
        same(y, fold, "all_reduce count " + std::to_string(count));
        auto buf = x;
        jitter(delays);
        all_reduce<float>(r.comm(), std::span<float>(buf));
        same(buf, fold, "all_reduce in place count " + std::to_string(count));
        const auto xs = random_floats(r.id(), count * n);
        std::vector<float> z(count);
        jitter(delays);
        reduce_scatter<float>(r.comm(), xs, z);
        std::vector<float> want(
            fold_rs.begin() + static_cast<std::ptrdiff_t>(r.id() * count),
            fold_rs.begin() + static_cast<std::ptrdiff_t>((r.id() + 1) * count));
        same(z, want, "reduce_scatter count " + std::to_string(count));
        if (run == 0) first[static_cast<std::size_t>(r.id())] = y;
        same(y, first[static_cast<std::size_t>(r.id())], "run-to-run");
      });
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace tspemu::test
