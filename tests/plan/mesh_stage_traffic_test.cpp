// decode_stage_traffic (plan/decode_cost.hpp) for SP and the TP+SP mesh, the stages the SP and
// mesh decoders measure (tsp/mesh_decoder.hpp): on every rank they sum to decode_step_traffic;
// SP has only the column's two stages (the LSE all-gather in fp32 and the output all-reduce) and
// the mesh adds the row's four; each stage's bytes equal the closed forms worked by hand here.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

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

std::vector<std::string> names(const std::vector<DecodeStageTraffic>& stages) {
  std::vector<std::string> n;
  n.reserve(stages.size());
  for (const auto& s : stages) n.push_back(s.what);
  return n;
}

// The counters of the stage named `what` (a failure, and empty counters, when there is none).
TrafficCounters stage(const std::vector<DecodeStageTraffic>& stages, const std::string& what) {
  for (const auto& s : stages)
    if (s.what == what) return s.traffic;
  ADD_FAILURE() << "no stage " << what;
  return {};
}

TEST(MeshStageTraffic, StagesSumToDecodeStepTrafficOnEveryRank) {
  const ModelShape m = gqa_model();
  for (const DecodeStrategy& st :
       {DecodeStrategy::sp(2), DecodeStrategy::sp(3), DecodeStrategy::sp(8),
        DecodeStrategy::tp_sp(2, 2), DecodeStrategy::tp_sp(2, 4), DecodeStrategy::tp_sp(4, 2)})
    for (const std::int64_t B : {1, 5})
      for (int r = 0; r < st.ranks(); ++r) {
        TrafficCounters sum;
        for (const auto& s : decode_stage_traffic(m, st, B, 4, r)) sum += s.traffic;
        EXPECT_EQ(sum, decode_step_traffic(m, st, B, 4, r))
            << st.name() << " B=" << B << " rank " << r;
      }
}

TEST(MeshStageTraffic, SpHasOnlyTheColumnStagesWithTheLseInFp32) {
  const auto t = decode_stage_traffic(gqa_model(), DecodeStrategy::sp(4), 3, 8, 1);
  EXPECT_EQ(names(t), (std::vector<std::string>{"LSE all-gather", "attention output all-reduce"}));
  // L all-gathers of the B·n_h fp32 LSE values: (Σ − 1) blocks each way.
  const TrafficCounters lse = stage(t, "LSE all-gather");
  EXPECT_EQ(lse[CollectiveKind::all_gather].calls, 3u);
  EXPECT_EQ(lse[CollectiveKind::all_gather].bytes_received, 3u * 3 * 3 * 8 * 4);
  // L all-reduces of B·h = 192 doubles over 4 ranks: 2·3/4 of the payload each way.
  EXPECT_EQ(stage(t, "attention output all-reduce")[CollectiveKind::all_reduce].bytes_sent,
            3u * 2 * 3 * 48 * 8);
}

TEST(MeshStageTraffic, TpSpSplitsTheOutputAndTheLseOverTheRow) {
  const auto t = decode_stage_traffic(gqa_model(), DecodeStrategy::tp_sp(2, 4), 1, 4, 5);
  // Column: LSE of n_h/T = 4 heads, output [1, h/T = 32] over Σ = 4.
  EXPECT_EQ(stage(t, "LSE all-gather")[CollectiveKind::all_gather].bytes_received, 3u * 3 * 4 * 4);
  EXPECT_EQ(stage(t, "attention output all-reduce")[CollectiveKind::all_reduce].bytes_received,
            3u * 2 * 3 * 8 * 4);
  // Row: o_proj and mlp all-reduce [1, 64] over T = 2 (32 + 32 elements each way); LM head
  // blocks of V/T = 24 logits.
  EXPECT_EQ(stage(t, "W_O all-reduce")[CollectiveKind::all_reduce].bytes_received, 3u * 64 * 4);
  EXPECT_EQ(stage(t, "MLP down all-reduce"), stage(t, "W_O all-reduce"));
  EXPECT_EQ(stage(t, "embedding all-reduce")[CollectiveKind::all_reduce].bytes_received,
            u64{64} * 4);
  EXPECT_EQ(stage(t, "LM head logits all-gather")[CollectiveKind::all_gather].bytes_received,
            u64{24} * 4);
  EXPECT_EQ(t.size(), 6u);
}

TEST(MeshStageTraffic, RefusesBadRanksAndBatches) {
  const ModelShape m = gqa_model();
  EXPECT_THROW(decode_stage_traffic(m, DecodeStrategy::sp(2), 1, 4, 2), std::invalid_argument);
  EXPECT_THROW(decode_stage_traffic(m, DecodeStrategy::sp(2), 0, 4, 0), std::invalid_argument);
  EXPECT_THROW(decode_stage_traffic(m, DecodeStrategy::tp_sp(3, 2), 1, 4, 0),
               std::invalid_argument);  // T = 3 divides no head count
}

}  // namespace
}  // namespace tspemu::tsp::cost
