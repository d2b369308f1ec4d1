// Memory per rank, measured by the arenas: weights are 1/D of the reference layer's (plus the
// replicated norm weight), transient buffers are the documented shard buffers, and activations
// scale with the rank's S/D tokens.
#include <gtest/gtest.h>

#include "arena_charges.hpp"
#include "strategy_checks.hpp"
#include "tspemu/plan/cost_model.hpp"

namespace tspemu::tsp::testing {
namespace {

// Every rank's arena after forward + backward, from a run that also passes the oracle rule.
std::vector<ArenaStats> arenas(const Case& c) {
  std::vector<ArenaStats> a(static_cast<std::size_t>(c.D));
  const check::Report r = check_tsp(c, [&](const RankBlockResult& rr) {
    a[static_cast<std::size_t>(rr.rb.rank().id())] = rr.rb.arena().stats();
  });
  EXPECT_TRUE(r.ok()) << printed(r);
  return a;
}

Case attention_case(int S, int buckets = 1) {
  Case c;
  c.block = Block::attention;
  c.D = 4;
  c.NH = 8;
  c.NKV = 8;
  c.B = 1;
  c.S = S;
  c.head_buckets = buckets;
  return c;
}

TEST(TspMemory, AttentionWeightsPerRankAreOneDthOfTheLayerPlusTheNorm) {
  for (bool overlap : {false, true}) {
    Case c = attention_case(64);
    c.overlap = overlap;
    const TspShape s = c.shape();
    const std::vector<ArenaStats> arena = arenas(c);
    const std::size_t C = static_cast<std::size_t>(s.model.hidden);
    const std::size_t layer_floats =
        2 * C * C + 2 * C * static_cast<std::size_t>(s.model.kv_dim());  // wq wk wv wo
    ASSERT_EQ(layer_floats % static_cast<std::size_t>(c.D), 0u);
    const std::size_t shard = attention_shard_size(s);
    for (const ArenaStats& a : arena) {
      EXPECT_EQ(peak(a, Category::weights), charged(layer_floats / c.D) + charged(C));
      // Transient: the broadcast shard, plus in backward this rank's partial gradient of it;
      // overlapped, two of each (one buffer of two shards each): the next shard arrives and the
      // previous gradient is reduced while the current ones are in use.
      EXPECT_EQ(peak(a, Category::comm), overlap ? 2 * charged(2 * shard) : 2 * charged(shard))
          << "overlap " << overlap;
      EXPECT_EQ(peak(a, Category::gradients), charged(shard) + charged(C));
    }
  }
}

// The cost model accounts the overlapped schedule's buffers exactly: its comm estimate grows by
// what the attention block's arenas measure — one packed shard and one partial gradient, and with
// head buckets the dK/dV send buffer (fp32 emulator sizes). The estimate is the layer's peak
// block's, so the sequence (2048 tokens) is long enough for attention to be the model's peak.
TEST(TspMemory, TheCostModelChargesTheOverlapsExtraBuffersAsMeasured) {
  for (int buckets : {1, 2}) {
    SCOPED_TRACE("head buckets " + std::to_string(buckets));
    std::size_t measured[2] = {0, 0};
    double modelled[2] = {0, 0};
    for (bool overlap : {false, true}) {
      Case c = attention_case(2048, buckets);
      c.overlap = overlap;
      const TspShape s = c.shape();
      measured[overlap] = peak(arenas(c)[0], Category::comm);
      cost::MemoryAssumptions as;
      as.precision = cost::PrecisionModel::fp32_emulator();
      as.tsp = cost_options(s.options);
      modelled[overlap] = cost::layer_memory(cost::ModelShape::from(s.model, c.B, c.S),
                                             cost::Strategy::tsp(c.D), as)
                              .comm;
    }
    const TspShape s = attention_case(2048, buckets).shape();
    const std::size_t dkv_send =
        buckets > 1 ? charged(2 * static_cast<std::size_t>(s.B) * s.S * s.model.kv_dim() / s.D /
                              static_cast<std::size_t>(buckets))
                    : 0;
    EXPECT_EQ(measured[1] - measured[0], 2 * charged(attention_shard_size(s)) + dkv_send);
    EXPECT_EQ(modelled[1] - modelled[0], static_cast<double>(measured[1] - measured[0]));
  }
}

TEST(TspMemory, MlpWeightsPerRankAreOneDthOfTheLayerAndTheRingHoldsFourShardsInBackward) {
  Case c = attention_case(64);
  c.block = Block::mlp;
  const TspShape s = c.shape();
  const std::vector<ArenaStats> arena = arenas(c);
  const std::size_t C = static_cast<std::size_t>(s.model.hidden),
                    F = static_cast<std::size_t>(s.model.ffn);
  for (const ArenaStats& a : arena) {
    EXPECT_EQ(peak(a, Category::weights), charged(3 * C * F / c.D) + charged(C));
    // Backward: two weight-ring buffers and two gradient-ring buffers (forward needs only two).
    EXPECT_EQ(peak(a, Category::comm), 4 * charged(mlp_shard_size(s)));
  }
}

TEST(TspMemory, ActivationsScaleWithTheRanksTokens) {
  for (Block b : {Block::attention, Block::mlp}) {
    Case shorter = attention_case(64), longer = attention_case(128);
    shorter.block = longer.block = b;
    const std::vector<ArenaStats> o1 = arenas(shorter), o2 = arenas(longer);
    for (std::size_t r = 0; r < o1.size(); ++r) {
      const std::size_t a1 = peak(o1[r], Category::activations),
                        a2 = peak(o2[r], Category::activations);
      EXPECT_GT(a1, 0u);
      EXPECT_EQ(a2, 2 * a1) << "rank " << r << ": doubling S must double the activations kept";
    }
    // The same tokens per rank on more ranks keep the same activations: 64 tokens on D=4 (16 per
    // rank) vs 32 tokens on D=2.
    Case fewer_ranks = shorter;
    fewer_ranks.D = 2;
    fewer_ranks.NH = fewer_ranks.NKV = 8;
    fewer_ranks.S = 32;
    const std::vector<ArenaStats> o3 = arenas(fewer_ranks);
    EXPECT_EQ(peak(o3[0], Category::activations), peak(o1[0], Category::activations));
  }
}

TEST(TspMemory, HeadBucketsShrinkTheGatheredKvBuffer) {
  const std::vector<ArenaStats> one = arenas(attention_case(64, 1)),
                                two = arenas(attention_case(64, 2));
  for (std::size_t r = 0; r < one.size(); ++r)
    EXPECT_EQ(peak(two[r], Category::kv) * 2, peak(one[r], Category::kv));
}

}  // namespace
}  // namespace tspemu::tsp::testing
