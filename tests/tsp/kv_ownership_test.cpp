// KvOwnership (kv_ownership.hpp) and RankKvCache (rank_kv_cache.hpp): the position -> rank map of a
// sequence-sharded KV cache, and one rank's share of it in arena memory.
#include "tspemu/tsp/kv_ownership.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "tspemu/runtime/arena.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"
#include "tspemu/tsp/sequence_layout.hpp"

namespace tspemu::tsp {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(KvOwnership, PromptDivisibleBy2DIsTheTrainingZigzagLayout) {
  const int D = 4;
  const KvOwnership own(D, 1, {16});
  EXPECT_TRUE(own.zigzag(0));
  const SequenceLayout zigzag(LayoutKind::zigzag, D, 16);
  for (int r = 0; r < D; ++r)
    for (const std::int64_t p : zigzag.positions(r)) EXPECT_EQ(own.owner(0, p), r) << p;
}

TEST(KvOwnership, OtherPromptsAreContiguousBalancedBlocksFirstRanksLonger) {
  const KvOwnership own(3, 1, {7, 2});  // 7 = 3 + 2 + 2; 2 < D: rank 2 holds none
  EXPECT_FALSE(own.zigzag(0));
  const std::vector<int> want7{0, 0, 0, 1, 1, 2, 2};
  for (int p = 0; p < 7; ++p) EXPECT_EQ(own.owner(0, p), want7[static_cast<std::size_t>(p)]) << p;
  EXPECT_EQ(own.owner(1, 0), 0);
  EXPECT_EQ(own.owner(1, 1), 1);
  EXPECT_EQ(own.count(2, 1, 2), 0);
}

TEST(KvOwnership, GeneratedTokensGoRoundRobinInBlocksOfIFromPromptLengthModD) {
  const KvOwnership own(3, 2, {7});  // start at rank 7 mod 3 = 1, blocks of 2
  const std::vector<int> want{1, 1, 2, 2, 0, 0, 1, 1, 2};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(own.owner(0, 7 + i), want[static_cast<std::size_t>(i)]);
}

TEST(KvOwnership, CountClosedFormEqualsEnumerationAndRanksStayWithinIOfEachOther) {
  for (const int D : {1, 2, 3, 4, 8})
    for (const int I : {1, 2, 3, 5}) {
      const std::vector<std::int64_t> prompts{1, 2, 7, 13, 16, 24};
      const KvOwnership own(D, I, prompts);
      for (int b = 0; b < own.batch(); ++b)
        for (std::int64_t n = 0; n <= 70; ++n) {
          std::int64_t lo = n, hi = 0, total = 0;
          for (int r = 0; r < D; ++r) {
            const std::int64_t c = own.count(r, b, n);
            const auto list = own.owned(r, b, n);
            ASSERT_EQ(c, static_cast<std::int64_t>(list.size()))
                << "D=" << D << " I=" << I << " seq " << b << " n=" << n << " rank " << r;
            ASSERT_TRUE(std::is_sorted(list.begin(), list.end()));
            lo = std::min(lo, c);
            hi = std::max(hi, c);
            total += c;
          }
          ASSERT_EQ(total, n) << "every position has exactly one owner";
          if (n >= prompts[static_cast<std::size_t>(b)]) {
            ASSERT_LE(hi - lo, I) << "D=" << D << " I=" << I << " seq " << b << " n=" << n;
          }
        }
    }
}

TEST(KvOwnership, BadArgumentsNameTheValue) {
  EXPECT_THAT([] { KvOwnership(0, 1, {4}); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("D=0")));
  EXPECT_THAT([] { KvOwnership(2, 0, {4}); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("I=0")));
  EXPECT_THAT(
      [] {
        KvOwnership(2, 1, {4, 0});
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("sequence 1")));
}

ref::ModelConfig tiny() {
  ref::ModelConfig c;
  c.vocab = 16;
  c.hidden = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn = 16;
  return c;
}

TEST(RankKvCache, ReservesItsOwnedPositionsInTheKvCacheCategoryByClosedForm) {
  Arena arena(1, std::size_t{1} << 20);
  const ref::ModelConfig cfg = tiny();  // NKV·hs = 8
  const KvOwnership own(2, 1, {5, 1});
  RankKvCache<float> cache(arena, 1, cfg, own, 12);
  // Below max_context 12, rank 1 owns positions 3, 4 (prompt block) and 5, 7, 9, 11 (round-robin
  // from rank 5 mod 2 = 1) of sequence 0, and 1, 3, .., 11 of sequence 1: 12 positions,
  // 2 (K, V) · L=2 · NKV·hs=8 · 4 bytes · 12 = 1536, a multiple of 64.
  EXPECT_EQ(cache.capacity(0), 6);
  EXPECT_EQ(cache.capacity(1), 6);
  EXPECT_EQ(cache.bytes(), 1536u);
  EXPECT_EQ(arena.stats().category_current[static_cast<std::size_t>(Category::kv_cache)], 1536u);
  EXPECT_EQ(cache.used_bytes(), 0u);
}

TEST(RankKvCache, AppendKeepsPositionsAddressableAndRefusesWhatIsNotItsToHold) {
  Arena arena(0, std::size_t{1} << 20);
  const ref::ModelConfig cfg = tiny();
  RankKvCache<double> cache(arena, 0, cfg, KvOwnership(2, 1, {5}), 8);  // rank 0: 0, 1, 2, 6
  std::vector<double> k(8), v(8);
  for (const std::int64_t pos : {0, 1, 6}) {
    std::fill(k.begin(), k.end(), static_cast<double>(pos));
    std::fill(v.begin(), v.end(), -static_cast<double>(pos));
    for (int l = 0; l < 2; ++l) cache.append(l, 0, pos, k.data(), v.data());
  }
  EXPECT_EQ(cache.held(1, 0), 3);
  EXPECT_EQ(cache.k(1, 0, 6)[3], 6.0);
  EXPECT_EQ(cache.v(0, 0, 1)[0], -1.0);
  EXPECT_EQ(cache.keys(0, 0)[8], 1.0);  // row 1 of [held, NKV, hs] is position 1
  EXPECT_EQ(cache.used_bytes(), 2u * 2 * 3 * 8 * sizeof(double));
  EXPECT_THAT(
      [&] { (void)cache.k(0, 0, 3); },
      ThrowsMessage<std::out_of_range>(HasSubstr("position 3 is not held here (owner: rank 1")));
  EXPECT_THAT([&] { cache.append(0, 0, 7, k.data(), v.data()); },
              ThrowsMessage<std::logic_error>(HasSubstr("rank 0 layer 0 sequence 0 position 7")));
  EXPECT_THAT([&] { cache.append(0, 0, 1, k.data(), v.data()); },
              ThrowsMessage<std::logic_error>(HasSubstr("ascending")));
  EXPECT_THAT([&] { cache.append(0, 0, 8, k.data(), v.data()); },
              ThrowsMessage<std::length_error>(HasSubstr("max_context=8")));
}

}  // namespace
}  // namespace tspemu::tsp
