// The Megatron-SP decode step and the SP / Megatron-SP prefill closed forms of
// plan/decode_cost.hpp against hand-derived values: Megatron-SP's padded rows (TP's volume when
// T | B), the SP ring pass-KV blocks of unequal size (what the ranks send sums to what they
// receive), Ulysses' padded slots, pass-Q's LSE and output; and the shapes each refuses.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan_test_shapes.hpp"
#include "tspemu/plan/decode_cost.hpp"

namespace tspemu::tsp::cost {
namespace {

using u64 = std::uint64_t;
constexpr u64 kFloat = 4;

using plan_testing::small_gqa;

TrafficCounters sum(const std::vector<DecodeStageTraffic>& stages) {
  TrafficCounters t;
  for (const auto& s : stages) t += s.traffic;
  return t;
}

// B = 5 at T = 4 pads to Np = 8 rows: each of the 4 collectives per layer moves (T−1)/T·8·h·β
// per device; at B = 8 the same bytes as TP's two all-reduces of B·h. Weights and KV as TP's.
TEST(MegatronSpCost, DecodePadsTheRowsToAMultipleOfTAndMovesTpsVolumeWhenTDividesB) {
  const ModelShape m = small_gqa();
  const DecodeStrategy st = DecodeStrategy::megatron_sp(4);
  EXPECT_EQ(st.name(), "Megatron-SP T=4");
  const DecodeCost c = decode_cost(m, st, std::vector<std::int64_t>(5, 9), kFloat);
  EXPECT_EQ(c.layer_collectives(), 4u);
  EXPECT_DOUBLE_EQ(c.comm_per_layer(), 4 * 0.75 * 8 * 64 * 4);
  const DecodeCost tp = decode_cost(m, DecodeStrategy::tp(4), std::vector<std::int64_t>(5, 9), 4);
  EXPECT_EQ(c.weight_bytes, tp.weight_bytes);
  EXPECT_EQ(c.kv_bytes, tp.kv_bytes);
  const std::vector<std::int64_t> eight(8, 9);
  EXPECT_DOUBLE_EQ(decode_cost(m, st, eight, kFloat).comm_per_layer(),
                   decode_cost(m, DecodeStrategy::tp(4), eight, kFloat).comm_per_layer());
  // A rank's count of one reduce-scatter: (T−1) blocks of Np/T·h·β each way.
  for (const DecodeStageTraffic& s : decode_stage_traffic(m, st, 5, kFloat, 1))
    if (s.what == "W_O reduce-scatter") {
      EXPECT_EQ(s.kind, CollectiveKind::reduce_scatter);
      EXPECT_EQ(s.traffic[CollectiveKind::reduce_scatter].calls, 3u);  // one per layer
      EXPECT_EQ(s.traffic[CollectiveKind::reduce_scatter].bytes_received, 3u * 3 * 2 * 64 * 4);
    }
}

// The prefill: N = 7 + 13 + 1 = 21 rows pad to 24 at T = 4; the logits all-gather is [B, V/T].
TEST(MegatronSpCost, PrefillCountsTheAllPromptRowsPadded) {
  const ModelShape m = small_gqa();
  const auto stages = megatron_sp_prefill_stage_traffic(m, 4, {7, 13, 1}, kFloat, 2);
  ASSERT_EQ(stages.size(), 7u);
  for (const DecodeStageTraffic& s : stages) {
    const auto& e = s.traffic[s.kind];
    const u64 per_call =
        s.what == "LM head logits all-gather" ? 3u * 3 * (48 / 4) * 4 : 3u * (24 / 4) * 64 * 4;
    EXPECT_EQ(e.bytes_received, e.calls * per_call) << s.what;
  }
  EXPECT_THROW(megatron_sp_prefill_stage_traffic(m, 4, {7, 0}, kFloat, 0), std::invalid_argument);
  EXPECT_THROW(megatron_sp_prefill_stage_traffic(m, 4, {7}, kFloat, 4), std::invalid_argument);
}

// Ring pass-KV with ranks owning 6, 5, 5, 5 of N = 21 tokens: rank r sends every block but rank
// r+1's and receives every block but its own; summed over the ranks, sent = received.
TEST(SpPrefillCost, RingBlocksOfUnequalSizeSumToWhatTheRanksReceive) {
  const ModelShape m = small_gqa();
  const std::vector<std::int64_t> lengths{7, 13, 1}, owned{6, 5, 5, 5};
  const u64 block = 2 * 32 * kFloat;  // one token's K and V
  u64 sent = 0, received = 0;
  for (int r = 0; r < 4; ++r) {
    const auto stages = sp_prefill_stage_traffic(m, 4, SpPrefill::ring, lengths, owned, kFloat, r);
    ASSERT_EQ(stages.size(), 2u);
    EXPECT_EQ(stages[0].what, "K/V ring");
    const TrafficCounters& t = stages[0].traffic;
    EXPECT_EQ(t[CollectiveKind::send].calls, 3u * 3);
    EXPECT_EQ(t[CollectiveKind::recv].calls, 3u * 3);
    const auto next = static_cast<u64>(owned[static_cast<std::size_t>((r + 1) % 4)]);
    const auto mine = static_cast<u64>(owned[static_cast<std::size_t>(r)]);
    EXPECT_EQ(t[CollectiveKind::send].bytes_sent, 3 * block * (21 - next));
    EXPECT_EQ(t[CollectiveKind::recv].bytes_received, 3 * block * (21 - mine));
    sent += t.total_sent();
    received += t.total_received();
    EXPECT_EQ(stages[1].what, "last rows all-reduce");
    EXPECT_EQ(stages[1].traffic[CollectiveKind::all_reduce].calls, 1u);
  }
  EXPECT_EQ(sent, received);
  EXPECT_THROW(sp_prefill_stage_traffic(m, 4, SpPrefill::ring, lengths, {6, 5, 5}, kFloat, 0),
               std::invalid_argument);
  EXPECT_THROW(sp_prefill_stage_traffic(m, 4, SpPrefill::ring, lengths, {6, 5, 5, 4}, kFloat, 0),
               std::invalid_argument);
}

// Ulysses at Σ = 4: M = ceil(7/4) + ceil(13/4) + ceil(1/4) = 2 + 4 + 1 = 7 slots; per layer Q and
// the output (NH/Σ = 2 heads) and K, V (NKV/Σ = 1 head) cross (Σ−1)/Σ of M rows each.
TEST(SpPrefillCost, UlyssesCountsThePaddedSlotsAndRefusesSigmaNotDividingTheHeads) {
  const ModelShape m = small_gqa();
  const auto stages = sp_prefill_stage_traffic(m, 4, SpPrefill::ulysses, {7, 13, 1}, {}, kFloat, 3);
  ASSERT_EQ(stages.size(), 2u);
  const auto& e = stages[0].traffic[CollectiveKind::all_to_all];
  EXPECT_EQ(e.calls, 4u * 3);
  EXPECT_EQ(e.bytes_received, 3u * 3 * 7 * (2 * 2 + 2 * 1) * 8 * 4);
  try {
    (void)sp_prefill_stage_traffic(m, 3, SpPrefill::ulysses, {7}, {}, kFloat, 0);
    ADD_FAILURE() << "Σ = 3 accepted";
  } catch (const std::invalid_argument& x) {
    const std::string what = x.what();
    EXPECT_NE(what.find("Σ=3"), std::string::npos) << what;
    EXPECT_NE(what.find("n_heads=8"), std::string::npos) << what;
  }
}

// Pass-Q: the LSE all-gather of N·NH fp32 values per rank and the output all-reduce of N·h, per
// layer; Σ = 1 moves nothing.
TEST(SpPrefillCost, PassQGathersTheLseAndReducesTheOutputOfEveryPromptRow) {
  const ModelShape m = small_gqa();
  const auto stages = sp_prefill_stage_traffic(m, 4, SpPrefill::pass_q, {7, 13, 1}, {}, kFloat, 0);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].traffic[CollectiveKind::all_gather].bytes_received, 3u * 3 * 21 * 8 * 4);
  EXPECT_EQ(stages[1].traffic[CollectiveKind::all_reduce].calls, 3u);
  EXPECT_TRUE(sum(sp_prefill_stage_traffic(m, 1, SpPrefill::ring, {7}, {7}, kFloat, 0)) ==
              TrafficCounters{});
}

}  // namespace
}  // namespace tspemu::tsp::cost
