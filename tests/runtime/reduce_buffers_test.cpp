// Reductions over a set of buffers: bitwise the per-buffer all_reduce / reduce_scatter on values
// whose sums round (so the rank order is checked), one collective with one counter entry, and a
// rank passing another set is a mismatch naming the counts.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "collective_checks.hpp"
#include "failure_checks.hpp"

namespace tspemu::test {
namespace {

// Values whose sums are not exact: float and double sums then depend on the order of the terms.
template <class T>
std::vector<T> noisy(int rank, std::size_t buffer, std::size_t count) {
  std::mt19937_64 gen(static_cast<std::uint64_t>(rank) * 1000003u + buffer);
  std::vector<T> v(count);
  if constexpr (std::is_floating_point_v<T>) {
    std::uniform_real_distribution<T> d(T(-1), T(1));
    for (auto& x : v) x = d(gen) * T(1 + buffer % 5);
  } else {
    std::uniform_int_distribution<T> d(-1000, 1000);
    for (auto& x : v) x = d(gen);
  }
  return v;
}

template <class T>
std::vector<std::span<T>> spans(std::vector<std::vector<T>>& set) {
  return {set.begin(), set.end()};
}

template <class T>
std::vector<std::vector<T>> noisy_set(int rank, const std::vector<std::size_t>& sizes) {
  std::vector<std::vector<T>> set;
  for (std::size_t i = 0; i < sizes.size(); ++i) set.push_back(noisy<T>(rank, i, sizes[i]));
  return set;
}

std::string ctx(const char* what, const Comm& c, std::size_t buffers, const char* tn) {
  return std::string(what) + " of " + std::to_string(buffers) + " buffers on " + c.name() +
         " (size " + std::to_string(c.size()) + ", rank " + std::to_string(c.rank()) + ") " + tn;
}

template <class T>
void check_all_reduce_buffers(Rank& rk, Comm& c, const std::vector<std::size_t>& sizes,
                              const char* tn) {
  const std::size_t n = static_cast<std::size_t>(c.size()), me = static_cast<std::size_t>(c.rank());
  auto set = noisy_set<T>(c.rank(), sizes);
  auto want = set;
  std::size_t total = 0;
  for (auto& w : want) {
    all_reduce<T>(c, std::span<T>(w));
    total += w.size();
  }
  CounterProbe p(rk, CollectiveKind::all_reduce);
  all_reduce_buffers<T>(c, spans(set));
  p.expect(expected_traffic(CollectiveKind::all_reduce, n, me, -1, total * sizeof(T), sizeof(T)),
           ctx("all_reduce_buffers counters", c, sizes.size(), tn));
  for (std::size_t i = 0; i < sizes.size(); ++i)
    same(set[i], want[i],
         ctx("all_reduce_buffers", c, sizes.size(), tn) + " buffer " + std::to_string(i));
}

template <class T>
void check_reduce_scatter_buffers(Rank& rk, Comm& c, const std::vector<std::size_t>& blocks,
                                  const char* tn) {
  const std::size_t n = static_cast<std::size_t>(c.size()), me = static_cast<std::size_t>(c.rank());
  std::vector<std::size_t> sizes;
  for (std::size_t b : blocks) sizes.push_back(b * n);
  auto set = noisy_set<T>(c.rank(), sizes);
  // Expected: this rank's block from reduce_scatter on each buffer in turn; the rest untouched.
  auto want = set;
  std::size_t total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::span<T> all(want[i]);
    reduce_scatter<T>(c, all, all.subspan(me * blocks[i], blocks[i]));
    total += sizes[i];
  }
  CounterProbe p(rk, CollectiveKind::reduce_scatter);
  reduce_scatter_buffers<T>(c, spans(set));
  p.expect(
      expected_traffic(CollectiveKind::reduce_scatter, n, me, -1, total * sizeof(T), sizeof(T)),
      ctx("reduce_scatter_buffers counters", c, sizes.size(), tn));
  for (std::size_t i = 0; i < sizes.size(); ++i)
    same(set[i], want[i],
         ctx("reduce_scatter_buffers", c, sizes.size(), tn) + " buffer " + std::to_string(i));
}

// Sizes around the chunk boundaries of the concatenation: empty, single, odd, and one large
// buffer next to small ones.
std::vector<std::size_t> set_sizes(int n) {
  std::vector<std::size_t> s = {7, 0, 1, 1000, 33, 2};
  if (!quick() || n <= 4) s.push_back(std::size_t{1} << 17);
  return s;
}

class ReduceBuffersTest : public ::testing::TestWithParam<int> {};

TEST_P(ReduceBuffersTest, AllReduceBuffersIsBitwiseTheAllReduceOfEachBuffer) {
  World& world = shared_world(GetParam());
  world.run([](Rank& r) {
    const auto sizes = set_sizes(r.size());
    check_all_reduce_buffers<float>(r, r.comm(), sizes, "float");
    check_all_reduce_buffers<double>(r, r.comm(), sizes, "double");
    check_all_reduce_buffers<std::int64_t>(r, r.comm(), {3, 100}, "int64");
    check_all_reduce_buffers<std::int32_t>(r, r.comm(), {1, 0, 65}, "int32");
    check_all_reduce_buffers<float>(r, r.comm(), {5}, "float");
    check_all_reduce_buffers<float>(r, r.comm(), {}, "float");
  });
}

TEST_P(ReduceBuffersTest, ReduceScatterBuffersIsBitwiseTheReduceScatterOfEachBuffer) {
  World& world = shared_world(GetParam());
  world.run([](Rank& r) {
    check_reduce_scatter_buffers<float>(r, r.comm(), {7, 0, 1, 250, 33}, "float");
    check_reduce_scatter_buffers<double>(r, r.comm(), {1, 4096, 3}, "double");
    check_reduce_scatter_buffers<std::int32_t>(r, r.comm(), {2, 9}, "int32");
    check_reduce_scatter_buffers<std::int64_t>(r, r.comm(), {}, "int64");
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReduceBuffersTest, ::testing::ValuesIn(world_sizes()),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

TEST(ReduceBuffers, RowsAndColumnsOfAMeshReduceIndependently) {
  shared_world(6).run([](Rank& r) {
    Mesh m = split_mesh(r, 2, 3);  // rows of 3, columns of 2
    check_all_reduce_buffers<float>(r, m.row, {7, 300, 1}, "float");
    check_reduce_scatter_buffers<float>(r, m.col, {3, 100}, "float");
    check_all_reduce_buffers<double>(r, m.col, {70, 0, 5}, "double");
    check_reduce_scatter_buffers<double>(r, m.row, {1, 0, 40}, "double");
  });
}

TEST(ReduceBuffers, ASetIsOneCollectiveWhateverItsNumberOfBuffers) {
  // The call after a set of three is collective #2 on every rank.
  expect_every_rank_throws<CollectiveMismatch>(
      shared_world(4),
      [](Rank& r) {
        std::vector<std::vector<float>> set = {std::vector<float>(10), std::vector<float>(300),
                                               std::vector<float>(4)};
        all_reduce_buffers<float>(r.comm(), spans(set));
        if (r.id() == 2)
          all_reduce<float>(r.comm(), std::span<float>(set[0]));
        else
          barrier(r.comm());
      },
      {"collective #2 on group world: rank 2 called all_reduce(count=10, float) while ranks 0-1, 3 "
       "called barrier(count=0, byte)"});
}

TEST(ReduceBuffers, ADifferentNumberOfBuffersIsAMismatchNamingTheCounts) {
  expect_every_rank_throws<CollectiveMismatch>(
      shared_world(4),
      [](Rank& r) {
        std::vector<std::vector<float>> set;
        if (r.id() == 2)
          set = {std::vector<float>(30), std::vector<float>(5)};
        else
          set = {std::vector<float>(10), std::vector<float>(20), std::vector<float>(5)};
        all_reduce_buffers<float>(r.comm(), spans(set));
      },
      {"collective #1 on group world: rank 2 called all_reduce_buffers(2 buffers: 30, 5 elements, "
       "total 35, float) while ranks 0-1, 3 called all_reduce_buffers(3 buffers: 10, 20, 5 "
       "elements, total 35, float)"});
}

TEST(ReduceBuffers, DifferentSizesAreAMismatchNamingThem) {
  expect_every_rank_throws<CollectiveMismatch>(
      shared_world(4),
      [](Rank& r) {
        std::vector<std::vector<double>> set = {std::vector<double>(r.id() == 3 ? 12 : 8),
                                                std::vector<double>(r.id() == 1 ? 0 : 4)};
        reduce_scatter_buffers<double>(r.comm(), spans(set));
      },
      {"collective #1 on group world: rank 1 called reduce_scatter_buffers(2 buffers: 8, 0 "
       "elements, total 8, double), rank 3 called reduce_scatter_buffers(2 buffers: 12, 4 "
       "elements, total 16, double) while ranks 0, 2 called reduce_scatter_buffers(2 buffers: 8, "
       "4 elements, total 12, double)"});
}

TEST(ReduceBuffers, APlainAllReduceAgainstASetIsAMismatch) {
  expect_every_rank_throws<CollectiveMismatch>(
      shared_world(4),
      [](Rank& r) {
        std::vector<std::vector<float>> set = {std::vector<float>(100)};
        if (r.id() == 0)
          all_reduce<float>(r.comm(), std::span<float>(set[0]));
        else
          all_reduce_buffers<float>(r.comm(), spans(set));
      },
      // A set's fingerprint differs from a plain call's only by its root, which describe() omits.
      {"collective #1 on group world: rank 0 called all_reduce(count=100, float) while ranks 1-3 "
       "called all_reduce(count=100, float)"});
}

TEST(ReduceBuffers, BadSetsAreInvalidArgumentNamingTheBuffers) {
  World& world = shared_world(3);
  world.run([](Rank& r) {
    Comm& c = r.comm();
    const std::string who = "rank " + std::to_string(r.id()) + ": ";
    std::vector<std::vector<float>> set = {std::vector<float>(6), std::vector<float>(7)};
    expect_bad_argument([&] { reduce_scatter_buffers<float>(c, spans(set)); },
                        {who, "reduce_scatter_buffers on group world",
                         "buffer 1 has 7 elements, not a multiple of the 3 ranks"});
    std::vector<float> a(12);
    std::vector<std::span<float>> overlapping = {std::span(a).first(3), std::span(a).subspan(6, 3),
                                                 std::span(a).subspan(4, 3)};
    expect_bad_argument([&] { all_reduce_buffers<float>(c, overlapping); },
                        {who, "all_reduce_buffers", "buffers 1 and 2 overlap"});
    expect_bad_argument([&] { reduce_scatter_buffers<float>(c, overlapping); },
                        {"reduce_scatter_buffers", "buffers 1 and 2 overlap"});
    barrier(c);  // the bad calls touched no mailbox: the world is still in step
  });
}

}  // namespace
}  // namespace tspemu::test
