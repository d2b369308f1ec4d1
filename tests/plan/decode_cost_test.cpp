// The decode cost model (plan/decode_cost.hpp) against the worked numbers of
// ../shared/INFERENCE-NOTES.md (§1.5, §4.3), its own closed forms, and the crossover rules.
// (a) §1.5, the paper's "7B" (h 4096, L 32, MHA, bf16), D = T = 8, B = 1, S = 128K: KV per token,
//     KV per rank, weights per rank, comm per decode step, S_max on 80 GB, each exactly in bytes
//     and at the notes' printed precision; GQA n_kv = 8 at D = 16: TP duplicates KV 2×.
// (b) §4.3's sonar capacity: 14 336 B/token/rank, 949 296 tokens at TP2, ×2 with CP2.
// (c) The crossovers: TSP-M moves fewer bytes than TP only when B > 8h; prefill TSP < TP iff
//     B·S > 8h (g = 1, F = 4).
// (d) Runtime counting: TSP-W's per-rank TrafficCounters sum to the ring convention's bytes; the
//     mesh schedules' counters likewise; bad shapes refused with the schedule named.
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan_test_shapes.hpp"
#include "tspemu/plan/decode_cost.hpp"

namespace tspemu::tsp::cost {
namespace {

using u64 = std::uint64_t;
constexpr u64 kBf16 = 2;
constexpr std::int64_t k128K = 131072;

std::string printed(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The notes' P: the 32 layers' weights (attention 4h², gated MLP 3·4h·h) and their norms (2h),
// no embedding or LM head: 32·(16h² + 2h) = 8 590 196 736 parameters. With the vocabulary
// (32000 × 4096, untied, + final norm) the model has 8 852 344 832; the notes' weights per rank
// (17.2 GB for SP8) and S_max for SP8 (0.96M) only hold without it, so vocab = 0 here.
ModelShape notes_7b() {
  ModelShape m = paper_7b(1, k128K);
  m.vocab = 0;
  return m;
}

TEST(DecodeCost, SevenBKvCachePerRank) {
  const ModelShape m = notes_7b();
  EXPECT_EQ(m.layers * m.layer_params(), 8590196736);
  // KV of one token, all layers, all heads: 2·L·h·β = 524 288 B = 0.5 MiB.
  EXPECT_EQ(static_cast<u64>(m.layers) * kv_bytes_per_token_layer(m, DecodeStrategy::sp(1), kBf16),
            u64{1} << 19);
  // 64 GiB per 128K sequence, 8 GiB per rank for every schedule (MHA: n_kv = 32 >= 8).
  for (const DecodeStrategy& st :
       {DecodeStrategy::tp(8), DecodeStrategy::sp(8), DecodeStrategy::tp_sp(2, 4),
        DecodeStrategy::helix(8, 1), DecodeStrategy::helix(4, 2), DecodeStrategy::tsp_w(8),
        DecodeStrategy::tsp_m(8)}) {
    const DecodeCost c = decode_cost(m, st, {k128K}, kBf16);
    EXPECT_EQ(c.kv_bytes, u64{8} << 30) << st.name();
    EXPECT_EQ(c.kv_duplication, 1.0) << st.name();
  }
}

TEST(DecodeCost, SevenBWeightsPerRank) {
  const ModelShape m = notes_7b();
  auto weights = [&](const DecodeStrategy& st) {
    return decode_cost(m, st, {k128K}, kBf16).weight_bytes;
  };
  // 32·(16h²/8 + 2h)·2 and 32·(16h²/2 + 2h)·2, 32·(16h² + 2h)·2 bytes.
  EXPECT_EQ(weights(DecodeStrategy::tp(8)), 2148007936u);
  EXPECT_EQ(weights(DecodeStrategy::tsp_w(8)), 2148007936u);
  EXPECT_EQ(weights(DecodeStrategy::tsp_m(8)), 2148007936u);
  EXPECT_EQ(weights(DecodeStrategy::tp_sp(2, 4)), 8590458880u);
  EXPECT_EQ(weights(DecodeStrategy::sp(8)), 17180393472u);
  EXPECT_EQ(printed("%.2f", 2148007936 / 1e9), "2.15");
  EXPECT_EQ(printed("%.1f", 8590458880 / 1e9), "8.6");
  EXPECT_EQ(printed("%.1f", 17180393472 / 1e9), "17.2");
  // TSP-M also holds one attention and one MLP shard in flight (h²·16/8 elements).
  EXPECT_EQ(decode_cost(m, DecodeStrategy::tsp_m(8), {1}, kBf16).buffer_bytes,
            u64{16} * 4096 * 4096 / 8 * 2);
  // Helix 8×1: W_Q/K/V whole (TP_A = 1), W_O and the MLP over N = 8 (see the header: the notes'
  // P_attn/TP_A would also keep W_O whole, 3.22 GB).
  EXPECT_EQ(weights(DecodeStrategy::helix(8, 1)),
            u64{32} * (3 * 4096 * 4096 + 13 * 4096 * 4096 / 8 + 2 * 4096) * 2);
}

TEST(DecodeCost, SevenBCommPerDecodeStep) {
  const ModelShape m = notes_7b();
  auto step = [&](const DecodeStrategy& st) { return decode_cost(m, st, {k128K}, kBf16); };
  // Without the LSE, as the notes print them.
  EXPECT_EQ(step(DecodeStrategy::sp(8)).comm_per_step(), 458752.0);          // 2·7/8·h·L·β
  EXPECT_EQ(step(DecodeStrategy::tp_sp(2, 4)).comm_per_step(), 720896.0);    // (2h + 3/4·h)·L·β
  EXPECT_EQ(step(DecodeStrategy::tp(8)).comm_per_step(), 917504.0);          // 4·7/8·h·L·β
  EXPECT_EQ(step(DecodeStrategy::tsp_w(8)).comm_per_step(), 1433600.0);      // 7/8·h·6.25·L·β
  EXPECT_EQ(step(DecodeStrategy::tsp_m(8)).comm_per_step(), 15032844288.0);  // 7/8·(16h²+2h)·L·β
  EXPECT_EQ(printed("%.2f MB", 458752 / 1e6), "0.46 MB");
  EXPECT_EQ(printed("%.2f MB", 720896 / 1e6), "0.72 MB");
  EXPECT_EQ(printed("%.2f MB", 917504 / 1e6), "0.92 MB");
  EXPECT_EQ(printed("%.2f MB", 1433600 / 1e6), "1.43 MB");
  EXPECT_EQ(printed("%.1f GB", 15032844288 / 1e9), "15.0 GB");
  // The fp32 LSE apart: the all-to-alls' (D−1)/D·B·n_h·4 per layer (TSP-W, TSP-M, Helix), the
  // all-gathers' (Σ−1)·B·n_h/T·4 (SP, TP+SP); TP has none. With it TSP-W is 1 437 184 B (prints
  // 1.44 MB) and SP8 487 424 B (0.49 MB): the notes' figures exclude the LSE.
  EXPECT_EQ(step(DecodeStrategy::tsp_w(8)).lse_per_step(), 7.0 / 8 * 32 * 4 * 32);
  EXPECT_EQ(step(DecodeStrategy::tsp_m(8)).lse_per_step(), 7.0 / 8 * 32 * 4 * 32);
  EXPECT_EQ(step(DecodeStrategy::helix(8, 1)).lse_per_step(), 7.0 / 8 * 32 * 4 * 32);
  EXPECT_EQ(step(DecodeStrategy::sp(8)).lse_per_step(), 7.0 * 32 * 4 * 32);
  EXPECT_EQ(step(DecodeStrategy::tp_sp(2, 4)).lse_per_step(), 3.0 * 16 * 4 * 32);
  EXPECT_EQ(step(DecodeStrategy::tp(8)).lse_per_step(), 0.0);
  // Collectives per layer: TP 2, SP 2 (LSE + output), TP+SP 4, Helix 3, TSP-W 5 (the LSE rides
  // with the partials), TSP-M D broadcasts + D−1 hops + D Q all-gathers + D all-to-alls.
  EXPECT_EQ(step(DecodeStrategy::tp(8)).layer_collectives(), 2u);
  EXPECT_EQ(step(DecodeStrategy::sp(8)).layer_collectives(), 2u);
  EXPECT_EQ(step(DecodeStrategy::tp_sp(2, 4)).layer_collectives(), 4u);
  EXPECT_EQ(step(DecodeStrategy::helix(4, 2)).layer_collectives(), 3u);
  EXPECT_EQ(step(DecodeStrategy::tsp_w(8)).layer_collectives(), 5u);
  EXPECT_EQ(step(DecodeStrategy::tsp_m(8)).layer_collectives(), 31u);
}

TEST(DecodeCost, SevenBMaxContextOn80GB) {
  const ModelShape m = notes_7b();
  const u64 budget = 80000000000;
  // (80e9 − weights) / (L·2·h·β/8) tokens: TSP a whole multiple of 8 (every rank's share of the
  // sequence equal), TP any count (every rank holds every token, 1/8 of its heads).
  const std::int64_t tsp = decode_max_context(m, DecodeStrategy::tsp_w(8), budget, kBf16);
  const std::int64_t tp = decode_max_context(m, DecodeStrategy::tp(8), budget, kBf16);
  const std::int64_t sp = decode_max_context(m, DecodeStrategy::sp(8), budget, kBf16);
  EXPECT_EQ(tsp, 1187920);
  EXPECT_EQ(tp, 1187927);
  EXPECT_EQ(sp, 958544);
  EXPECT_EQ(printed("%.2fM", static_cast<double>(tsp) / 1e6), "1.19M");
  EXPECT_EQ(printed("%.2fM", static_cast<double>(tp) / 1e6), "1.19M");
  EXPECT_EQ(printed("%.2fM", static_cast<double>(sp) / 1e6), "0.96M");
  // TSP-M's in-flight shards take 0.54 GB more than TSP-W.
  EXPECT_LT(decode_max_context(m, DecodeStrategy::tsp_m(8), budget, kBf16), tsp);
  EXPECT_EQ(decode_max_context(m, DecodeStrategy::sp(8), 1000, kBf16), 0);
}

TEST(DecodeCost, GqaAtSixteenTpDuplicatesKvTspAndHelixDoNot) {
  ModelShape m = notes_7b();
  m.n_kv_heads = 8;
  const DecodeCost tp = decode_cost(m, DecodeStrategy::tp(16), {k128K}, kBf16);
  const DecodeCost tsp = decode_cost(m, DecodeStrategy::tsp_w(16), {k128K}, kBf16);
  const DecodeCost helix = decode_cost(m, DecodeStrategy::helix(16, 1), {k128K}, kBf16);
  const DecodeCost helix_tp = decode_cost(m, DecodeStrategy::helix(2, 8), {k128K}, kBf16);
  EXPECT_EQ(tp.kv_duplication, 2.0);
  EXPECT_EQ(tsp.kv_duplication, 1.0);
  EXPECT_EQ(helix.kv_duplication, 1.0);
  EXPECT_EQ(helix_tp.kv_duplication, 1.0);
  EXPECT_EQ(tp.kv_bytes, 2 * tsp.kv_bytes);
  EXPECT_EQ(tsp.kv_bytes, helix.kv_bytes);
  EXPECT_EQ(tsp.kv_bytes, helix_tp.kv_bytes);
  // 128K tokens × 32 layers × 2·(h/4)·β / 16.
  EXPECT_EQ(tsp.kv_bytes, u64{k128K} * 32 * 2 * 1024 * 2 / 16);
}

TEST(DecodeCost, SonarCapacityAtTp2AndCp2) {
  // Qwen3-0.6B-like: 28 layers, head size 128, one KV head (16 query heads; h = 16·128 here, as
  // ModelShape ties d to h/n_h; the KV bytes do not depend on h).
  ModelShape m;
  m.hidden = 2048;
  m.n_heads = 16;
  m.n_kv_heads = 1;
  m.ffn = 3072;
  m.layers = 28;
  const DecodeStrategy tp2 = DecodeStrategy::tp(2), cp2 = DecodeStrategy::tp_sp(2, 2);
  // TP2 > n_kv = 1: each rank holds the one KV head: 2·28·128·1·2 = 14 336 B per token per rank.
  EXPECT_EQ(m.layers * kv_bytes_per_token_layer(m, tp2, kBf16), 14336u);
  EXPECT_EQ(decode_cost(m, tp2, {1}, kBf16).kv_duplication, 2.0);
  // 949 296 tokens × 14 336 B = 13 609 107 456 B = 12.6745 GiB, which prints as the notes'
  // 12.67 GiB; 949 296 = 59 331 blocks of 16 tokens. A budget of exactly 12.67 GiB
  // (13 604 308 910 B) holds 948 961 tokens: the notes' "12.67 GiB" is rounded, the exact
  // budget behind 949 296 is at least 13 609 107 456 B. Budgets here are KV budgets: the
  // weights are added so decode_max_context subtracts them again.
  const u64 kv_budget = 13609107456;
  EXPECT_EQ(printed("%.2f", static_cast<double>(kv_budget) / (1u << 30)), "12.67");
  const u64 w2 = decode_cost(m, tp2, {1}, kBf16).weight_bytes;
  EXPECT_EQ(decode_max_context(m, tp2, kv_budget + w2, kBf16), 949296);
  EXPECT_EQ(decode_max_context(m, tp2, kv_budget + 14335 + w2, kBf16), 949296);
  EXPECT_EQ(decode_max_context(m, tp2, 13604308910 + w2, kBf16), 948961);
  // CP2 (each TP pair holds half the tokens; the same per-rank bytes as vLLM's DCP2 inside TP2):
  // 7 168 B per token of context per rank, twice the tokens.
  const u64 wcp = decode_cost(m, cp2, {1}, kBf16).weight_bytes;
  EXPECT_EQ(decode_max_context(m, cp2, kv_budget + wcp, kBf16), 2 * 949296);
}

TEST(DecodeCost, TspmCrossoverIsBEquals8h) {
  // g = 1, F = 4, D = T: TSP-M/TP = (16h² + 2Bh)/(4Bh) = 4h/B + 1/2 < 1 iff B > 8h.
  ModelShape m = notes_7b();
  m.hidden = 256;
  m.n_heads = m.n_kv_heads = 4;
  m.ffn = 4 * m.hidden;
  m.layers = 1;
  const std::int64_t crossover = 8 * m.hidden;
  for (int D : {2, 4}) {
    auto bytes = [&](const DecodeStrategy& st, std::int64_t B) {
      return decode_cost(m, st, std::vector<std::int64_t>(static_cast<std::size_t>(B), 1), kBf16)
          .comm_per_step();
    };
    const DecodeStrategy tspm = DecodeStrategy::tsp_m(D), tp = DecodeStrategy::tp(D);
    EXPECT_GT(bytes(tspm, crossover - 1), bytes(tp, crossover - 1)) << D;
    EXPECT_EQ(bytes(tspm, crossover), bytes(tp, crossover)) << D;
    EXPECT_LT(bytes(tspm, crossover + 1), bytes(tp, crossover + 1)) << D;
    EXPECT_DOUBLE_EQ(bytes(tspm, 16) / bytes(tp, 16), 4.0 * 256 / 16 + 0.5);
  }
}

TEST(DecodeCost, PrefillCrossoverIsBSEquals8h) {
  ModelShape m = notes_7b();
  m.layers = 1;
  const std::int64_t h = m.hidden;
  for (std::int64_t BS : {8 * h - 1024, 8 * h, 8 * h + 1024}) {
    m.B = 1;
    m.S = BS;
    const double tsp = prefill_elements(m, DecodeStrategy::tsp_w(8));
    const double tp = prefill_elements(m, DecodeStrategy::tp(8));
    EXPECT_EQ(tsp, prefill_elements(m, DecodeStrategy::tsp_m(8)));
    EXPECT_EQ(tsp<tp, BS> 8 * h) << BS;
    EXPECT_EQ(tsp == tp, BS == 8 * h) << BS;
  }
  // 32K prompt tokens for h = 4096: B = 2 of 16K is the same point.
  m.B = 2;
  m.S = 16384;
  EXPECT_EQ(prefill_elements(m, DecodeStrategy::tsp_w(8)),
            prefill_elements(m, DecodeStrategy::tp(8)));
}

using plan_testing::small_gqa;

TEST(DecodeCost, TspwRuntimeCountsSumToTheRingConvention) {
  const ModelShape m = small_gqa();
  constexpr u64 kFloat = 4;
  for (int D : {2, 4}) {
    // Every owner pattern of B = 3 tokens over D ranks, including a rank owning none.
    const std::vector<std::vector<int>> patterns = {{0, 0, 0}, {0, 1, 1}, {D - 1, 0, D - 1}};
    for (const std::vector<int>& owners : patterns) {
      const u64 B = owners.size();
      TrafficCounters sum;
      for (int r = 0; r < D; ++r) {
        const TrafficCounters t = tspw_decode_step_traffic(m, D, owners, kFloat, r);
        sum += t;
        // The route: this rank sends its K/V slice of each token it does not own.
        u64 foreign = 0, mine = 0;
        for (int o : owners) (o == r ? mine : foreign) += 1;
        const u64 slice = 2 * (32 / static_cast<u64>(D)) * kFloat;
        EXPECT_EQ(t[CollectiveKind::send].bytes_sent, 3 * foreign * slice);
        EXPECT_EQ(t[CollectiveKind::recv].bytes_received, 3 * mine * (D - 1) * slice);
        EXPECT_EQ(t[CollectiveKind::all_gather].calls, 3u + 1u);  // Q per layer + logits
        EXPECT_EQ(t[CollectiveKind::all_to_all].calls, 3u);
        EXPECT_EQ(t[CollectiveKind::all_reduce].calls, 3u * 2 + 1);
        // Q: (D−1) blocks of B·h/D floats; logits (D−1) blocks of B·V/D.
        const u64 Du = static_cast<u64>(D);
        const u64 q = 3 * (Du - 1) * B * (64 / Du) * kFloat, lg = (Du - 1) * B * (48 / Du) * kFloat;
        EXPECT_EQ(t[CollectiveKind::all_gather].bytes_received, q + lg);
        const u64 a2a = 3 * (Du - 1) * B * (64 / Du + 8 / Du) * kFloat;
        EXPECT_EQ(t[CollectiveKind::all_to_all].bytes_sent, a2a);
      }
      // Summed over the ranks, the sent bytes are D × the ring convention's per-device bytes
      // (layers + vocabulary, LSE included): the route's average (D−1)/D·B·slice per device is
      // exact in sum, each token's slice being sent by the D−1 ranks that do not own it.
      const DecodeCost c =
          decode_cost(m, DecodeStrategy::tsp_w(D), std::vector<std::int64_t>(B, 5), kFloat);
      const double ring = c.comm_per_step() + c.lse_per_step() + c.vocab_per_step();
      EXPECT_DOUBLE_EQ(static_cast<double>(sum.total_sent()), D * ring) << D;
      EXPECT_EQ(sum.total_sent(), sum.total_received()) << D;
    }
  }
}

TEST(DecodeCost, TspwRouteAndLseOptions) {
  const ModelShape m = small_gqa();
  const std::vector<int> owners = {1, 1};
  const TrafficCounters packed = tspw_decode_layer_traffic(m, 2, owners, 4, 0);
  TspwDecodeOptions apart;
  apart.lse_packed = false;
  apart.route = KvRoute::all_gather;
  const TrafficCounters split = tspw_decode_layer_traffic(m, 2, owners, 4, 0, apart);
  EXPECT_EQ(split[CollectiveKind::all_to_all].calls, 2u);
  EXPECT_EQ(split[CollectiveKind::all_to_all].bytes_sent,
            packed[CollectiveKind::all_to_all].bytes_sent);
  EXPECT_EQ(split[CollectiveKind::send].calls, 0u);
  // All-gather route: Q (B·h/D) and the K/V slices of every token (B·2·kv/D).
  EXPECT_EQ(split[CollectiveKind::all_gather].bytes_received, (2u * 32 + 2u * 2 * 16) * 4);
  // Rank 0 owns no token: it sends both tokens' slices in one send and receives none.
  EXPECT_EQ(packed[CollectiveKind::send].calls, 1u);
  EXPECT_EQ(packed[CollectiveKind::recv].calls, 0u);
  EXPECT_EQ(tspw_decode_layer_traffic(m, 2, owners, 4, 1)[CollectiveKind::recv].calls, 1u);
}

TEST(DecodeCost, MeshRuntimeCountsSumToTheRingConvention) {
  const ModelShape m = small_gqa();
  for (const DecodeStrategy& st :
       {DecodeStrategy::tp(4), DecodeStrategy::sp(3), DecodeStrategy::tp_sp(2, 2),
        DecodeStrategy::helix(2, 2), DecodeStrategy::helix(4, 1)}) {
    const DecodeCost c = decode_cost(m, st, {7, 9}, 4);
    TrafficCounters sum;
    for (int r = 0; r < st.ranks(); ++r) sum += decode_step_traffic(m, st, 2, 4, r);
    const double ring = c.comm_per_step() + c.lse_per_step() + c.vocab_per_step();
    EXPECT_DOUBLE_EQ(static_cast<double>(sum.total_sent()), st.ranks() * ring) << st.name();
    EXPECT_EQ(sum.total_sent(), sum.total_received()) << st.name();
  }
  // TP's two all-reduces per layer and the vocabulary's all-reduce + all-gather.
  const TrafficCounters tp = decode_step_traffic(m, DecodeStrategy::tp(4), 2, 4, 1);
  EXPECT_EQ(tp[CollectiveKind::all_reduce].calls, 3u * 2 + 1);
  // All-reduce of B·h = 128 floats over 4: (128 − 32) + 3·32 elements each way, 7 calls.
  EXPECT_EQ(tp[CollectiveKind::all_reduce].bytes_sent, 7u * (128 - 32 + 3 * 32) * 4);
  EXPECT_EQ(tp[CollectiveKind::all_gather].bytes_received, 3u * 2 * 12 * 4);
}

TEST(DecodeCost, RefusesShapesItCannotRun) {
  ModelShape m = small_gqa();
  auto message = [&](const DecodeStrategy& st) -> std::string {
    try {
      decode_cost(m, st, {4}, 2);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(DecodeStrategy::tp(3)).find("TP T=3"), std::string::npos);
  EXPECT_NE(message(DecodeStrategy::tp(3)).find("must divide n_heads=8"), std::string::npos);
  // T = 8 > n_kv = 4: a multiple of it, accepted (KV duplicated 2×); T = 6 is not.
  EXPECT_EQ(message(DecodeStrategy::tp(8)), "");
  EXPECT_EQ(decode_cost(m, DecodeStrategy::tp(8), {4}, 2).kv_duplication, 2.0);
  m.n_heads = 12;
  m.hidden = 96;
  m.ffn = std::int64_t{96} * 6;
  EXPECT_NE(message(DecodeStrategy::tp(6)).find("multiple of it"), std::string::npos);
  EXPECT_NE(message(DecodeStrategy::tsp_w(5)).find("TSP-W D=5"), std::string::npos);
  EXPECT_THROW(decode_cost(m, DecodeStrategy::tsp_w(2), {}, 2), std::invalid_argument);
  EXPECT_THROW(decode_cost(m, DecodeStrategy::tsp_w(2), {0}, 2), std::invalid_argument);
  EXPECT_THROW(tspw_decode_layer_traffic(m, 2, {2}, 2, 0), std::invalid_argument);
  EXPECT_THROW(tspw_decode_layer_traffic(m, 2, {0}, 2, 2), std::invalid_argument);
  EXPECT_THROW(decode_step_traffic(m, DecodeStrategy::tsp_m(2), 1, 2, 0), std::invalid_argument);
}

TEST(DecodeCost, StrategiesAtEight) {
  std::vector<std::string> names;
  for (const DecodeStrategy& st : decode_strategies_at(8)) names.push_back(st.name());
  EXPECT_EQ(names, (std::vector<std::string>{"TP T=8", "SP Σ=8", "TP+SP T=2×Σ=4", "TP+SP T=4×Σ=2",
                                             "Helix KVP=8×TP_A=1", "Helix KVP=4×TP_A=2",
                                             "Helix KVP=2×TP_A=4", "TSP-M D=8", "TSP-W D=8"}));
}

TEST(DecodeCost, KvAndHbmForABatchOfUnequalLengths) {
  const ModelShape m = small_gqa();
  // Σ_b ceil(S_b / 4) tokens on the most loaded rank: 2 + 3 + 1 = 6.
  const DecodeCost c = decode_cost(m, DecodeStrategy::tsp_w(4), {8, 9, 1}, 4);
  EXPECT_EQ(c.kv_tokens, 6u);
  EXPECT_EQ(c.kv_bytes, 3u * 6 * 2 * 32 * 4);  // L · tokens · 2 · kv_dim · β
  EXPECT_EQ(c.hbm_read_bytes, c.weight_bytes + c.kv_bytes);
  // TSP-M reads every shard of every layer (and the whole vocabulary) each step.
  const DecodeCost mm = decode_cost(m, DecodeStrategy::tsp_m(4), {8, 9, 1}, 4);
  EXPECT_EQ(mm.hbm_read_bytes,
            static_cast<u64>(m.layers * m.layer_params() + m.vocab_params()) * 4 + mm.kv_bytes);
}

// decode_stage_traffic: one stage per collective with calls of its own, named as decode_cost's
// entries; Helix's LSE rides in the partials' all-to-all (its bytes, no call of its own).
TEST(DecodeCost, MeshStagesNameTheCollectivesAndCarryThePackedLse) {
  const ModelShape m = small_gqa();  // h = 64, n_h = 8, L = 3
  auto names = [](const std::vector<DecodeStageTraffic>& stages) {
    std::vector<std::string> n;
    n.reserve(stages.size());
    for (const DecodeStageTraffic& s : stages) n.push_back(s.what);
    return n;
  };
  const auto tp = decode_stage_traffic(m, DecodeStrategy::tp(4), 2, 4, 1);
  EXPECT_EQ(names(tp),
            (std::vector<std::string>{"W_O all-reduce", "MLP down all-reduce",
                                      "embedding all-reduce", "LM head logits all-gather"}));
  const auto helix = decode_stage_traffic(m, DecodeStrategy::helix(2, 2), 2, 4, 3);
  ASSERT_EQ(names(helix), (std::vector<std::string>{"partials all-to-all", "W_O all-reduce",
                                                    "MLP down all-reduce", "embedding all-reduce",
                                                    "LM head logits all-gather"}));
  // Per layer, to the other KVP member: B·(h/N) outputs of β = 4 and B·(n_h/N) LSE of 4 bytes.
  const TrafficCounters::Entry a2a = helix[0].traffic[CollectiveKind::all_to_all];
  EXPECT_EQ(a2a.calls, 3u);
  EXPECT_EQ(a2a.bytes_sent, 3u * (2 * 16 * 4 + 2 * 2 * 4));
  EXPECT_EQ(a2a.bytes_received, a2a.bytes_sent);
  TrafficCounters sum;
  for (const DecodeStageTraffic& s : helix) sum += s.traffic;
  EXPECT_EQ(sum, decode_step_traffic(m, DecodeStrategy::helix(2, 2), 2, 4, 3));
  EXPECT_THROW(decode_stage_traffic(m, DecodeStrategy::tsp_w(2), 2, 4, 0), std::invalid_argument);
}

}  // namespace
}  // namespace tspemu::tsp::cost
