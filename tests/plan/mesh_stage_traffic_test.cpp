// mesh_decode_stage_traffic (plan/decode_cost.hpp): SP's and TP+SP's decode step split into the
// decoders' stages (tsp/mesh_decoder.hpp) sums, on every rank, to decode_step_traffic's counters
// (the planner's one definition of those schedules' bytes), with each stage on its own group:
// the row stages empty at T = 1, the column stages at Σ = 1; and it refuses what it cannot count.
#include <gtest/gtest.h>

#include <stdexcept>

#include "tspemu/plan/decode_cost.hpp"

namespace tspemu::tsp::cost {
namespace {

using u64 = std::uint64_t;

// GQA g = 2 with 4 KV heads (T = 2, 4 divide them), h 64, L 3, V 48 (T | V).
ModelShape gqa_model() {
  ModelShape m;
  m.hidden = 64, m.n_heads = 8, m.n_kv_heads = 4, m.ffn = 96, m.layers = 3, m.vocab = 48;
  return m;
}

TEST(MeshStageTraffic, StagesSumToDecodeStepTrafficOnEveryRank) {
  const ModelShape m = gqa_model();
  for (const DecodeStrategy& st :
       {DecodeStrategy::sp(2), DecodeStrategy::sp(3), DecodeStrategy::sp(8),
        DecodeStrategy::tp_sp(2, 2), DecodeStrategy::tp_sp(2, 4), DecodeStrategy::tp_sp(4, 2)})
    for (const std::int64_t B : {1, 5})
      for (int r = 0; r < st.ranks(); ++r) {
        const MeshStageTraffic t = mesh_decode_stage_traffic(m, st, B, 4, r);
        EXPECT_EQ(t.total(), decode_step_traffic(m, st, B, 4, r))
            << st.name() << " B=" << B << " rank " << r;
      }
}

TEST(MeshStageTraffic, SpHasOnlyTheColumnStagesWithTheLseInFp32) {
  const ModelShape m = gqa_model();
  const MeshStageTraffic t = mesh_decode_stage_traffic(m, DecodeStrategy::sp(4), 3, 8, 1);
  const TrafficCounters none;
  EXPECT_EQ(t.embedding, none);
  EXPECT_EQ(t.o_proj, none);
  EXPECT_EQ(t.mlp, none);
  EXPECT_EQ(t.lm_head, none);
  // L all-gathers of the B·n_h fp32 LSE values: (Σ − 1) blocks each way.
  EXPECT_EQ(t.lse_gather[CollectiveKind::all_gather].calls, 3u);
  EXPECT_EQ(t.lse_gather[CollectiveKind::all_gather].bytes_received, 3u * 3 * 3 * 8 * 4);
  // L all-reduces of B·h = 192 doubles over 4 ranks: 2·3/4 of the payload each way.
  EXPECT_EQ(t.output_reduce[CollectiveKind::all_reduce].bytes_sent, 3u * 2 * 3 * 48 * 8);
}

TEST(MeshStageTraffic, TpSpSplitsTheOutputAndTheLseOverTheRow) {
  const ModelShape m = gqa_model();
  const MeshStageTraffic t = mesh_decode_stage_traffic(m, DecodeStrategy::tp_sp(2, 4), 1, 4, 5);
  // Column: LSE of n_h/T = 4 heads, output [1, h/T = 32] over Σ = 4.
  EXPECT_EQ(t.lse_gather[CollectiveKind::all_gather].bytes_received, 3u * 3 * 4 * 4);
  EXPECT_EQ(t.output_reduce[CollectiveKind::all_reduce].bytes_received, 3u * 2 * 3 * 8 * 4);
  // Row: o_proj and mlp all-reduce [1, 64] over T = 2 (32 + 32 elements each way); LM head
  // blocks of V/T = 24 logits.
  EXPECT_EQ(t.o_proj[CollectiveKind::all_reduce].bytes_received, 3u * 64 * 4);
  EXPECT_EQ(t.mlp, t.o_proj);
  EXPECT_EQ(t.embedding[CollectiveKind::all_reduce].bytes_received, u64{64} * 4);
  EXPECT_EQ(t.lm_head[CollectiveKind::all_gather].bytes_received, u64{24} * 4);
}

TEST(MeshStageTraffic, RefusesOtherSchedulesBadRanksAndTNotDividingTheVocabulary) {
  ModelShape m = gqa_model();
  EXPECT_THROW(mesh_decode_stage_traffic(m, DecodeStrategy::tp(2), 1, 4, 0), std::invalid_argument);
  EXPECT_THROW(mesh_decode_stage_traffic(m, DecodeStrategy::sp(2), 1, 4, 2), std::invalid_argument);
  EXPECT_THROW(mesh_decode_stage_traffic(m, DecodeStrategy::sp(2), 0, 4, 0), std::invalid_argument);
  m.vocab = 47;
  EXPECT_THROW(mesh_decode_stage_traffic(m, DecodeStrategy::tp_sp(2, 2), 1, 4, 0),
               std::invalid_argument);
  EXPECT_NO_THROW(mesh_decode_stage_traffic(m, DecodeStrategy::sp(2), 1, 4, 0));
}

}  // namespace
}  // namespace tspemu::tsp::cost
