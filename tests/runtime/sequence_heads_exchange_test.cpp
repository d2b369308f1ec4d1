// Sequence <-> heads exchange (Ulysses): every element lands where the layout formula says, the
// inverse restores the input, the traffic is an all_to_all's, and bad or mismatched calls are
// named errors.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "collective_checks.hpp"
#include "failure_checks.hpp"

namespace tspemu::test {
namespace {

std::string str(const SequenceHeadsShape& s) {
  return "B=" + std::to_string(s.B) + " S_local=" + std::to_string(s.S_local) +
         " H=" + std::to_string(s.H) + " hs=" + std::to_string(s.hs);
}

// Element (b, s, h, f) of rank q's sequence-sharded tensor: a distinct small integer encoding
// (q, b, s, h, f), exact in float.
template <class T>
T code(const SequenceHeadsShape& sh, std::size_t q, std::size_t b, std::size_t s, std::size_t h,
       std::size_t f) {
  return static_cast<T>((((q * sh.B + b) * sh.S_local + s) * sh.H + h) * sh.hs + f);
}

template <class T>
void check_exchange(Rank& rk, Comm& c, const SequenceHeadsShape& sh, const char* tn) {
  const std::size_t n = static_cast<std::size_t>(c.size()), me = static_cast<std::size_t>(c.rank());
  const std::size_t Hn = sh.H / n, count = sh.B * sh.S_local * sh.H * sh.hs;
  const std::string what = str(sh) + " " + tn + " on " + c.name() + " rank " + std::to_string(me);
  std::vector<T> in;  // [B, S_local, H, hs]
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t s = 0; s < sh.S_local; ++s)
      for (std::size_t h = 0; h < sh.H; ++h)
        for (std::size_t f = 0; f < sh.hs; ++f) in.push_back(code<T>(sh, me, b, s, h, f));
  // [B, n·S_local, Hn, hs]: token q·S_local + s is rank q's local token s; heads of this rank.
  std::vector<T> want;
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t q = 0; q < n; ++q)
      for (std::size_t s = 0; s < sh.S_local; ++s)
        for (std::size_t j = 0; j < Hn; ++j)
          for (std::size_t f = 0; f < sh.hs; ++f)
            want.push_back(code<T>(sh, q, b, s, me * Hn + j, f));
  std::vector<T> heads(count, T(-1)), back(count, T(-1));
  CounterProbe p(rk, CollectiveKind::all_to_all);
  all_to_all_sequence_to_heads<T>(c, in, heads, sh);
  same(heads, want, "sequence_to_heads " + what);
  all_to_all_heads_to_sequence<T>(c, heads, back, sh);
  // Each direction moves what an all_to_all of the tensor moves.
  const Traffic one =
      expected_traffic(CollectiveKind::all_to_all, n, me, -1, count * sizeof(T), sizeof(T));
  p.expect({2 * one.sent, 2 * one.received}, "both exchanges' counters " + what, 2);
  // The codes are distinct over all ranks, so this pins down the inverse's every element too.
  same(back, in, "heads_to_sequence after sequence_to_heads " + what);
}

class SequenceHeadsExchangeTest : public ::testing::TestWithParam<int> {};

TEST_P(SequenceHeadsExchangeTest, EveryElementLandsWhereTheLayoutSaysAndTheInverseRestoresIt) {
  const std::size_t n = static_cast<std::size_t>(GetParam());
  World& world = shared_world(GetParam());
  world.run([&](Rank& r) {
    for (std::size_t B : {1, 2})
      for (std::size_t H : {n, 2 * n})
        for (std::size_t S : {1, 3, 5})
          for (std::size_t hs : {1, 4}) {
            const SequenceHeadsShape sh{B, S, H, hs};
            check_exchange<float>(r, r.comm(), sh, "float");
            check_exchange<std::int64_t>(r, r.comm(), sh, "int64");
          }
    // Large enough that every rank's input is read in place (not copied into the mailbox).
    check_exchange<double>(r, r.comm(), {2, 16, 2 * n, 8}, "double");
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SequenceHeadsExchangeTest, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

TEST(SequenceHeadsExchange, RowsAndColumnsOfAMeshExchangeIndependently) {
  World& world = shared_world(6);
  world.run([](Rank& r) {
    Mesh m = split_mesh(r, 2, 3);  // rows of 3, columns of 2
    check_exchange<float>(r, m.row, {2, 3, 6, 4}, "float");
    check_exchange<std::int32_t>(r, m.col, {1, 5, 4, 2}, "int32");
    check_exchange<float>(r, m.row, {1, 2, 3, 1}, "float");
  });
}

TEST(SequenceHeadsExchange, BadShapesAndBuffersAreInvalidArgumentNamingTheValues) {
  World& world = shared_world(4);
  world.run([](Rank& r) {
    Comm& c = r.comm();
    const std::string who = "rank " + std::to_string(r.id()) + ": ";
    std::vector<float> a(96), b(96);
    expect_bad_argument(
        [&] {
          all_to_all_sequence_to_heads<float>(c, a, b, {1, 4, 6, 4});
        },
        {who, "all_to_all_sequence_to_heads on group world",
         "H = 6 heads are not divisible by the 4 ranks"});
    expect_bad_argument(
        [&] {
          all_to_all_heads_to_sequence<float>(c, a, b, {2, 3, 2, 8});
        },
        {who, "all_to_all_heads_to_sequence", "H = 2 heads", "4 ranks"});
    std::span<float> as(a), bs(b);
    expect_bad_argument(
        [&] {
          all_to_all_sequence_to_heads<float>(c, as.first(95), bs, {1, 3, 8, 4});
        },
        {who, "in [B, S_local, H, hs] = [1, 3, 8, 4] needs 96 elements, has 95"});
    expect_bad_argument(
        [&] {
          all_to_all_sequence_to_heads<float>(c, as, bs.first(48), {1, 3, 8, 4});
        },
        {"out [B, n·S_local, H/n, hs] = [1, 12, 2, 4] needs 96 elements, has 48"});
    expect_bad_argument(
        [&] {
          all_to_all_heads_to_sequence<float>(c, as.first(90), bs, {1, 3, 8, 4});
        },
        {"in [B, n·S_local, H/n, hs] = [1, 12, 2, 4] needs 96 elements, has 90"});
    expect_bad_argument(
        [&] {
          all_to_all_sequence_to_heads<float>(c, as.first(48), as.subspan(40, 48), {1, 3, 4, 4});
        },
        {"in and out overlap"});
    barrier(c);  // the bad calls touched no mailbox: the world is still in step
  });
}

// One rank makes another call than the others' sequence_to_heads of [1, 4, 4, 4]: every rank
// throws CollectiveMismatch naming both calls, including shapes of the same size (which the
// element count alone would not catch).
TEST(SequenceHeadsExchange, AnotherCallOnOneRankIsAMismatchNamingBothCalls) {
  using Call = std::function<void(Comm&, std::span<const float>, std::span<float>)>;
  struct Case {
    int odd;
    Call call;
    std::vector<std::string> parts;
  };
  const std::string others = "called all_to_all_sequence_to_heads(B=1, S_local=4, H=4, hs=4)";
  const std::vector<Case> cases = {
      {2,
       [](Comm& c, auto in, auto out) {
         all_to_all_sequence_to_heads<float>(c, in, out, {1, 2, 8, 4});
       },
       {"collective #1 on group world: rank 2 called all_to_all_sequence_to_heads(B=1, S_local=2, "
        "H=8, hs=4) while ranks 0-1, 3 " +
        others}},
      {1,
       [](Comm& c, auto in, auto out) {
         all_to_all_sequence_to_heads<float>(c, in.first(48), out.first(48), {1, 3, 4, 4});
       },
       {"collective #1 on group world: rank 1 called all_to_all_sequence_to_heads(B=1, S_local=3, "
        "H=4, hs=4) while ranks 0, 2-3 " +
        others}},
      {3,
       [](Comm& c, auto in, auto out) {
         all_to_all_heads_to_sequence<float>(c, in, out, {1, 4, 4, 4});
       },
       {"collective #1 on group world: rank 3 called all_to_all_heads_to_sequence(B=1, S_local=4, "
        "H=4, hs=4) while ranks 0-2 " +
        others}},
      // The fingerprint tells the exchange from a plain all_to_all, but describes both alike.
      {1,
       [](Comm& c, auto in, auto out) { all_to_all<float>(c, in, out); },
       {"collective #1 on group world: rank 1 called all_to_all(count=64, float) while ranks 0, "
        "2-3 called all_to_all(count=64, float)"}},
  };
  for (const Case& k : cases)
    expect_every_rank_throws<CollectiveMismatch>(
        shared_world(4),
        [&](Rank& r) {
          std::vector<float> a(64), b(64);
          if (r.id() == k.odd)
            k.call(r.comm(), a, b);
          else
            all_to_all_sequence_to_heads<float>(r.comm(), a, b, {1, 4, 4, 4});
        },
        k.parts);
}

}  // namespace
}  // namespace tspemu::test
