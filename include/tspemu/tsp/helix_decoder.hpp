// BasicHelixDecoder: Helix inference (KV parallelism × tensor parallelism in attention, TP in the
// FFN, on the same ranks) — prefill and decode of a batch of sequences on the N = KVP × TP_A ranks
// of a world, the KV cache sharded over the sequence across KVP and over the KV heads across TP_A,
// checked token by token against the reference decoder (reference/decode.hpp) and the fp64 oracle
// (tests/tsp/helix_decoder_test.cpp). INFERENCE-NOTES.md §1.3-1.4; TSP-W (tspw_decoder.hpp) is
// Helix with the attention weights sharded over all N instead of replicated over KVP.
//
// Ranks: rank = k·TP_A + a (the planner's layout, plan/decode_cost.hpp: a TP_A group is a row, a
//   KVP group a column): k in [0, KVP) the rank's token shard, a in [0, TP_A) its head shard. The
//   KVP group of a (ranks a, TP_A + a, ...) is a Comm::split of the world (color a, key k).
// Shape: DecodeShape (tspw_decoder.hpp) with D = N, and KVP; validate_helix() is the rule: KVP | N,
//   TP_A = N/KVP with TP_A | NH and (TP_A | NKV, or NKV | TP_A: each KV head duplicated TP_A/NKV
//   times over the head shards, as TP's, tp_decoder.hpp), N | NH (every rank owns NH/N heads after
//   the all-to-all), N | F, N | V.
// Weights (cut from the master; NHa = NH/TP_A, NKVa = max(NKV/TP_A, 1), NHn = NH/N, Fn = F/N):
//   rank (k, a) holds head shard a of W_Q (NHa heads) and of W_K/W_V (NKVa KV heads), replicated
//   over the KVP ranks of column a; the W_O columns of query heads (a·KVP + k)·NHn.. (row-parallel
//   over all N: the heads this rank owns after the all-to-all — head block a·KVP + k, not block
//   rank; handing a rank W_O's block `rank` instead is TRT-LLM PR #10350's bug, notes §3 row 2);
//   MLP shard rank of N; vocabulary rows [rank·V/N, (rank+1)·V/N); norms whole.
// Cache: position -> token shard by KvOwnership (kv_ownership.hpp) with D = KVP (prompt zigzag when
//   2·KVP | P_b, else contiguous blocks; generated tokens round-robin in blocks of I); rank (k, a)
//   holds the post-RoPE K and V of its NKVa KV heads at the positions shard k owns, in a
//   RankKvCache whose rank() is k. Every rank of column a computes the new tokens' K/V of head
//   shard a; the owner keeps them: no K/V moves.
//
// One step (prefill: every prompt token; decode: one token per sequence), N_t new tokens, per rank:
//   x = all_reduce over N(rows of the rank's vocabulary shard, zeros elsewhere)    [N_t, C]
//   per layer:
//     n = rmsnorm(x); q, k, v of head shard a; rope at global positions; owners append k, v
//     attend:   per sequence, its queries (NHa heads) over THIS rank's keys of it, masked by
//               global position; a rank with no visible key gives out 0, lse -inf (never NaN)
//     partials: all_to_all over the KVP group of (out, lse): member j receives heads j·NHn.. of
//               the NHa, from every member, and merges them by log-sum-exp in member order
//               0..KVP-1 (merge_attention_partials; an empty partial leaves the result unchanged)
//     o_proj:   all_reduce over N of att·W_O^(a·KVP+k)ᵀ [N_t, C]; mid = x + sum
//     mlp:      as TP over N (column gate/up, row down + all_reduce over N); x = mid + sum
//   lm_head: rmsnorm of each sequence's last new row; logits of the rank's V/N ids; all_gather
//            over N -> [B, V]
// Collectives per step: 2 + 3·L in 5 stages (last_traffic(); no partials all-to-all when
//   KVP = 1), the planner's Helix decode (decode_stage_traffic(helix(KVP, TP_A)) equals them stage
//   by stage on every rank for T = float: the LSE travels as T in the partials' all_to_all, the
//   planner counts it as 4 bytes).
// Requirements: validate_helix(shape, kvp); a world of N ranks; master weights shaped as
//   ModelWeights::zeros(model); the same calls with the same arguments on every rank; prefill
//   before decode_step; not in a dry run; the decoder lives inside one World::run.
// Guarantees:
//   - logits [B, V] bitwise identical on every rank, runs bitwise repeatable, a sequence's
//     logits independent of its batch-mates, bitwise.
//   - Bad input throws std::invalid_argument (std::length_error past max_context) naming the
//     sequence, position and value before anything is computed or cached.
//   - kv_cache_bytes() = round_up(2·L·NKVa·hs·sizeof(T)·Σ_b count(k, b, max_context), 64), the
//     arena's Category::kv_cache charge: the planner's kv_bytes_per_token_layer(helix) × L × the
//     positions shard k reserves.
// Cost per decode step (B tokens): per rank per layer an all_to_all over KVP of
//   (KVP-1)/KVP·B·(NHa·hs + NHa) elements and two all_reduce of B·C over N; embedding
//   all_reduce of B·C, LM head all_gather (N-1)/N·B·V. Memory phases: "helix.prefill",
//   "helix.decode".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/decoder_base.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"
#include "tspemu/tsp/tspw_decoder.hpp"

namespace tspemu::tsp {

// std::invalid_argument naming the values unless Helix decode can run the shape with N = s.D
// ranks and KVP = kvp (the rule above; also a valid model, batch >= 1, max_context > 0, I >= 1).
void validate_helix(const DecodeShape& s, int kvp);

// What this rank's collectives moved in the last prefill or decode_step, by stage (summed over
// layers).
struct HelixTraffic {
  TrafficCounters embedding, partials, o_proj, mlp, lm_head;
  TrafficCounters total() const { return embedding + partials + o_proj + mlp + lm_head; }
};

// Test-only faults: broken schedules the checks must catch (tests/tsp/helix_decoder_test.cpp).
enum class HelixFault {
  none,
  o_proj_by_rank,  // W_O's head block `rank` instead of a·KVP + k (TRT-LLM PR #10350)
};

template <class T>
class BasicHelixDecoder final : public DecoderBase<T, DecodeShape, HelixTraffic> {
 public:
  BasicHelixDecoder(Rank& rank, const DecodeShape& shape, int kvp,
                    const ref::ModelWeights<T>& master, HelixFault fault = HelixFault::none);
  ~BasicHelixDecoder() override;
  // prefill, decode_step, cache, kv_cache_bytes, length, last_traffic, shape: DecoderBase.

  int first_kv_head() const;  // the model's KV head of the cache's head 0
  int kvp() const { return kvp_; }

 private:
  using Base = DecoderBase<T, DecodeShape, HelixTraffic>;
  using Base::rank_, Base::s_, Base::cache_, Base::traffic_;
  struct Weights;
  struct Pass;  // one step's new tokens and scratch buffers
  CacheLayout cache_layout() const override;
  std::vector<T> forward(detail::DecodeStep&& step) override;
  void attention(int layer, Pass& pass);

  int kvp_;
  Comm kvp_comm_;  // this rank's KVP group (its column)
  std::unique_ptr<Weights> w_;
};

using HelixDecoder = BasicHelixDecoder<float>;
extern template class BasicHelixDecoder<float>;
extern template class BasicHelixDecoder<double>;

}  // namespace tspemu::tsp
