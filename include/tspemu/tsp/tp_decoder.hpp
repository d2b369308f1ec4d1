// BasicTpDecoder: Megatron tensor-parallel inference — prefill and decode of a batch of sequences
// on the T ranks of a world, each rank caching ALL positions of its own KV heads (no sequence
// sharding), checked token by token against the reference decoder (reference/decode.hpp) and the
// fp64 oracle (tests/tsp/tp_decoder_test.cpp). The TP baseline of the decode strategies.
//
// Shape: DecodeShape (tspw_decoder.hpp) with D = T; interleave is not used (no position is
//   sharded). validate_tp() is its rule: T | NH, T | F, T | V, and for the KV heads either
//   T | NKV (NKV/T whole KV heads per rank) or NKV | T (T > NKV: KV DUPLICATION, below); any
//   other T is refused naming T and NKV.
// KV duplication (INFERENCE-NOTES.md §1.4, "TP (T) ... duplicates past T = n_kv"): when T > NKV,
//   rank r's NH/T query heads all belong to KV head r / (T/NKV) (g = NH/NKV query heads per KV
//   head, NH/T of them per rank, T/NKV ranks per KV head), so each rank holds that ONE KV head: its
//   W_K/W_V rows and its cache. Each KV head's weights and cache exist T/NKV times over the world,
//   and every rank's cache is 2·L·hs·Σ positions elements where the sharded share would be
//   NKV/T of that.
// Weights (cut from the master): rank r holds rows r·NHl·hs.. of W_Q, its KV heads' rows of W_K and
//   W_V (column-parallel), columns r·NHl·hs.. of W_O (row-parallel), rows r·F/T.. of gate/up and
//   those columns of down, rows [r·V/T, (r+1)·V/T) of the embedding and of the LM head, the norm
//   weights whole (NHl = NH/T, NKVl = max(NKV/T, 1), Fl = F/T).
// Cache: a RankKvCache (rank_kv_cache.hpp) over a one-shard KvOwnership (every position is this
//   rank's; its rank() is 0, the index in a group of one token shard), of NKVl heads, reserved at
//   prefill for max_context positions per sequence: post-RoPE K and V at global positions.
//
// One step (prefill: every prompt token; decode: one token per sequence), N new tokens, per rank:
//   x = all_reduce(rows of r's vocabulary shard, zeros elsewhere)          [N, C] embedding, exact
//   per layer:
//     n = rmsnorm(x); q, k, v = n·W_Q^(r)ᵀ, n·W_K^(r)ᵀ, n·W_V^(r)ᵀ          [N, NHl|NKVl, hs]
//     rope(q, k) at global positions; append k, v of every new token to the cache
//     attend:  per sequence, its queries over all its cached keys (causal by global position)
//     o_proj:  all_reduce of att^(r)·W_O^(r)ᵀ [N, C] (row-parallel); mid = x + sum
//     mlp:     n = rmsnorm(mid); all_reduce of (silu(n·W_gate^(r)ᵀ) ⊙ n·W_up^(r)ᵀ)·W_down^(r)ᵀ;
//              x = mid + sum
//   lm_head: rmsnorm of each sequence's last new row; logits of r's V/T ids; all_gather -> [B, V]
// Collectives per step: 2 + 2·L in 4 stages (last_traffic()), the planner's TP decode
//   (plan/decode_cost.hpp: decode_stage_traffic(tp(T)) equals them stage by stage on every rank).
// Requirements: validate_tp(shape); a world of T ranks; master weights shaped as
//   ModelWeights::zeros(model); the same calls with the same arguments on every rank; prefill
//   before decode_step (a new prefill starts a new batch); not in a dry run. The decoder holds its
//   Rank and arena buffers: it lives inside one World::run.
// Guarantees:
//   - logits [B, V] bitwise identical on every rank (all-reduced and all-gathered), runs bitwise
//     repeatable, a sequence's logits independent of its batch-mates, bitwise.
//   - Bad input throws std::invalid_argument (std::length_error past max_context) naming the
//     sequence, position and value before anything is computed or cached.
//   - kv_cache_bytes() = round_up(2·L·NKVl·hs·sizeof(T)·B·max_context, 64), the arena's
//     Category::kv_cache charge (rank_kv_cache.hpp); the planner's kv_bytes_per_token_layer(tp(T))
//     × L × B·max_context, rounded likewise.
// Cost per decode step (B tokens): weights P/T read once per sequence; per rank per layer two
//   all_reduce of B·C; embedding all_reduce of B·C, LM head all_gather (T-1)/T·B·V. Memory
//   phases: "tp.prefill", "tp.decode".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/decoder_base.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"
#include "tspemu/tsp/tspw_decoder.hpp"

namespace tspemu::tsp {

// std::invalid_argument naming the values unless TP decode can run the shape with T = s.D: a valid
// model, T >= 1, batch >= 1, max_context > 0, interleave >= 1, T | NH, T | F, T | V, and T | NKV or
// NKV | T.
void validate_tp(const DecodeShape& s);
// KV heads one rank holds: NKV/T, or 1 (duplicated) when T > NKV.
int tp_kv_heads_per_rank(const ref::ModelConfig& m, int T);

// What this rank's collectives moved in the last prefill or decode_step, by stage (summed over
// layers).
struct TpTraffic {
  TrafficCounters embedding, o_proj, mlp, lm_head;
  TrafficCounters total() const { return embedding + o_proj + mlp + lm_head; }
};

template <class T>
class BasicTpDecoder final : public DecoderBase<T, DecodeShape, TpTraffic> {
 public:
  BasicTpDecoder(Rank& rank, const DecodeShape& shape, const ref::ModelWeights<T>& master);
  ~BasicTpDecoder() override;
  // prefill, decode_step, cache, kv_cache_bytes, length, last_traffic, shape: DecoderBase.

  int first_kv_head() const;  // the model's KV head of the cache's head 0

 private:
  using Base = DecoderBase<T, DecodeShape, TpTraffic>;
  using Base::rank_, Base::s_, Base::cache_, Base::traffic_;
  struct Weights;
  struct Pass;  // one step's new tokens and scratch buffers
  CacheLayout cache_layout() const override;
  std::vector<T> forward(detail::DecodeStep&& step) override;
  void attention(int layer, Pass& pass);

  std::unique_ptr<Weights> w_;
};

using TpDecoder = BasicTpDecoder<float>;
extern template class BasicTpDecoder<float>;
extern template class BasicTpDecoder<double>;

}  // namespace tspemu::tsp
