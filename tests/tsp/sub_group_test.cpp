// Blocks on sub-groups (runtime/mesh.hpp axes): the two-level token layout's positions; ring and
// Ulysses attention cores on the `sp` axis of a DP × SP mesh, checked by the check kit against
// the reference (gradients summed over the world pass; summed over `sp` only, the data-parallel
// replicas differ and the check says so); USP (Ulysses within a row × ring across rows) at 2×2,
// 2×4 and 4×2 within the rule with k as for ring and Ulysses.
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tspemu/check/block_check.hpp"
#include "tspemu/check/replicated_weights.hpp"
#include "tspemu/runtime/mesh.hpp"
#include "tspemu/tsp/ring_attention.hpp"
#include "tspemu/tsp/sequence_layout.hpp"
#include "tspemu/tsp/ulysses_attention.hpp"
#include "tspemu/tsp/usp_attention.hpp"

namespace tspemu::tsp::testing {
namespace {

TEST(TwoLevelLayout, RankOIHoldsTheInnerSplitOfOuterZigzagShardO) {
  // S = 16 zigzag over 2 rows: row 0 holds 0..3 and 12..15, row 1 holds 4..11; each row's 8
  // tokens then split contiguously over 2 ranks.
  const TwoLevelLayout l(LayoutKind::zigzag, 2, LayoutKind::contiguous, 2, 16);
  EXPECT_EQ(l.local_tokens(), 4);
  EXPECT_EQ(l.positions(0, 0), (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(l.positions(0, 1), (std::vector<std::int64_t>{12, 13, 14, 15}));
  EXPECT_EQ(l.positions(1, 0), (std::vector<std::int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(l.positions(1, 1), (std::vector<std::int64_t>{8, 9, 10, 11}));
  // Zigzag over 4 rows (chunks of 4: row 1 holds 4..7 and 24..27), then zigzag again over the 2
  // ranks of each row's 8 tokens (local chunks of 2: rank 0 local 0, 1, 6, 7).
  const TwoLevelLayout z(LayoutKind::zigzag, 4, LayoutKind::zigzag, 2, 32);
  EXPECT_EQ(z.positions(1, 0), (std::vector<std::int64_t>{4, 5, 26, 27}));
  EXPECT_EQ(z.positions(1, 1), (std::vector<std::int64_t>{6, 7, 24, 25}));
}

TEST(TwoLevelLayout, EveryPositionIsHeldOnceAndBadSizesAreNamed) {
  for (auto [R, U] : {std::pair{2, 2}, std::pair{2, 4}, std::pair{4, 2}, std::pair{3, 1}}) {
    const int S = 4 * R * U;
    const TwoLevelLayout l(LayoutKind::zigzag, R, LayoutKind::contiguous, U, S);
    std::set<std::int64_t> seen;
    for (int o = 0; o < R; ++o)
      for (int i = 0; i < U; ++i)
        for (std::int64_t p : l.positions(o, i)) EXPECT_TRUE(seen.insert(p).second) << p;
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(S));
    EXPECT_EQ(*seen.rbegin(), S - 1);
  }
  try {
    (void)TwoLevelLayout(LayoutKind::zigzag, 2, LayoutKind::contiguous, 3, 16);
    ADD_FAILURE() << "S/R = 8 tokens over 3 ranks accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("zigzag over 2 then contiguous over 3 of S=16"),
              std::string::npos)
        << e.what();
  }
}

ref::ModelConfig sub_group_model() {
  return {.vocab = 16, .hidden = 64, .n_layers = 1, .n_heads = 8, .n_kv_heads = 4, .ffn = 192};
}

enum class SpCore { ring, ulysses };

// DP × SP on 4 ranks: two replicas of 2 batches each, the core on the `sp` axis of 2 ranks.
check::Report dp_sp_report(SpCore kind, bool reduce_over_world) {
  const int S = 32, B = 4;
  const SequenceLayout layout(LayoutKind::zigzag, 2, S);
  check::BlockCheck c;
  c.name = kind == SpCore::ring ? "dp x ring" : "dp x ulysses";
  c.model = sub_group_model();
  c.ranks = 4;
  c.B = B;
  c.S = S;
  c.tokens = check::data_parallel(2, 2, B, check::sequence_sharded(layout, 1));
  return check::check_block(c, [&](check::RankBlock& rb) {
    Mesh mesh(rb.rank(), {{"dp", 2}, {"sp", 2}});
    std::vector<std::int64_t> group;  // the sp axis' members' positions, member-major
    for (int q = 0; q < 2; ++q)
      for (std::int64_t p : layout.positions(q)) group.push_back(p);
    const ref::ModelConfig& m = rb.config();
    const ref::AttentionDims d{rb.batches(), rb.tokens(),  rb.tokens(),
                               m.n_heads,    m.n_kv_heads, m.head_size()};
    Comm& sp = mesh.axis("sp");
    auto core = kind == SpCore::ring ? ring_attention_core(sp, rb.arena(), d, group)
                                     : ulysses_attention_core(sp, rb.arena(), d, group);
    check::attention_with_replicated_weights(rb, core, reduce_over_world ? rb.comm() : sp);
  });
}

TEST(SubGroupCores, RingAndUlyssesOnTheSpAxisOfADpBySpMeshPassTheRule) {
  for (SpCore kind : {SpCore::ring, SpCore::ulysses}) {
    const check::Report r = dp_sp_report(kind, /*reduce_over_world=*/true);
    EXPECT_TRUE(r.ok()) << r.headline;
    // Summed over `sp` only, each replica's weight gradients miss the other replica's batches.
    const check::Report partial = dp_sp_report(kind, /*reduce_over_world=*/false);
    EXPECT_FALSE(partial.ok());
    ASSERT_NE(partial.find("wq"), nullptr);
    EXPECT_FALSE(partial.find("wq")->ok());
    EXPECT_TRUE(partial.find("y")->ok());
  }
}

// USP on R rows × U columns: world rank o·U + i; Ulysses on the row, ring on the column.
check::Report usp_report(int R, int U) {
  const int S = 8 * R * U, B = 2;
  const TwoLevelLayout layout(LayoutKind::zigzag, R, LayoutKind::contiguous, U, S);
  check::BlockCheck c;
  c.name = "usp " + std::to_string(R) + "x" + std::to_string(U);
  c.model = sub_group_model();
  c.ranks = R * U;
  c.B = B;
  c.S = S;
  c.tokens = check::two_level_sharded(layout, B);
  return check::check_block(c, [&](check::RankBlock& rb) {
    Mesh mesh(rb.rank(), {{"ring", R}, {"ulysses", U}});
    const ref::ModelConfig& m = rb.config();
    const ref::AttentionDims d{rb.batches(), rb.tokens(),  rb.tokens(),
                               m.n_heads,    m.n_kv_heads, m.head_size()};
    check::attention_with_replicated_weights(
        rb, usp_attention_core(mesh.axis("ulysses"), mesh.axis("ring"), rb.arena(), d, layout));
  });
}

TEST(SubGroupCores, UspPassesTheRuleAtTwoByTwoTwoByFourAndFourByTwo) {
  for (auto [R, U] : {std::pair{2, 2}, std::pair{2, 4}, std::pair{4, 2}}) {
    const check::Report r = usp_report(R, U);
    EXPECT_TRUE(r.ok()) << r.headline;
    if (!r.ok()) r.print(std::cerr);
  }
}

}  // namespace
}  // namespace tspemu::tsp::testing
