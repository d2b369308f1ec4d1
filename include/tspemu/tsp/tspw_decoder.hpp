// BasicTspwDecoder: TSP-W inference (weights stationary) — prefill and decode of a batch of
// sequences on the D ranks of a world, with the key/value cache sharded over the sequence and
// held as rank state (rank_kv_cache.hpp), checked token by token against the reference decoder
// (reference/decode.hpp) and the fp64 oracle (tests/tsp/tspw_decode_test.cpp).
//
// Weights (as TSP training holds them, packed_shards.hpp; cut from the master): rank r holds head
//   shard r of W_Q, W_K, W_V (column-parallel) and W_O (row-parallel), MLP shard r of gate/up
//   (column) and down (row), rows [r·V/D, (r+1)·V/D) of the embedding and of the LM head, and
//   the norm weights whole. No weight ever moves (TSP-M, which circulates them as training does,
//   is the other variant: INFERENCE-NOTES.md §1.3).
// Cache: position -> rank by KvOwnership (kv_ownership.hpp): the prompt zigzag when 2D | P_b,
//   else in contiguous balanced blocks; generated tokens round-robin in blocks of I. Each owner
//   holds the post-RoPE K and V of ALL KV heads of its positions; RoPE always at the global
//   position. The cache is reserved at prefill for max_context positions (rank_kv_cache.hpp).
//
// One step (prefill: every prompt token; decode: one token per sequence), N new tokens, n_b of
// sequence b at global positions s_b.., per rank r (letters of model_config.hpp; NHl = NH/D,
// NKVl = NKV/D, Fl = F/D, Vl = V/D):
//   x = all_reduce(rows of r's vocabulary shard, zeros elsewhere)     [N, C] embedding, exact
//   per layer:
//     n = rmsnorm(x); q, k, v = n·W_Q^(r)ᵀ, n·W_K^(r)ᵀ, n·W_V^(r)ᵀ      [N, NHl|NKVl, hs]
//     rope(q, k) at global positions
//     route:    all_gather of (k, v) of head shard r of every new token; each token's owner
//               appends the D head slices as one row [NKV, hs] to its cache
//     q gather: all_gather of q -> every query's NH heads on every rank
//     attend:   per sequence, its queries over THIS rank's keys of it (causal_attention_forward
//               with the global positions of queries and keys: the causal mask of a multi-token
//               step is by global position); a rank with no visible key gives out 0, lse -inf
//     partials: all_to_all of (out, lse) to the head owners: rank r receives heads r·NHl.. from
//               every rank and merges them by log-sum-exp in rank order 0..D-1
//               (merge_attention_partials; an empty partial leaves the result unchanged)
//     o_proj:   all_reduce of att^(r)·W_O^(r)ᵀ [N, C] (row-parallel); mid = x + sum
//     mlp:      n = rmsnorm(mid); all_reduce of (silu(n·W_gate^(r)ᵀ) ⊙ n·W_up^(r)ᵀ)·W_down^(r)ᵀ;
//               x = mid + sum
//   lm_head: rmsnorm of each sequence's last new row; logits of r's Vl ids; all_gather -> [B, V]
// Collectives per step: 2 + 5·L in 7 stages (last_traffic()). The route is an all-gather, so
//   each rank receives the K/V of all N tokens for the head shards it does not own and keeps only
//   its own tokens': (D-1)/D · 2·N·NKV·hs elements, where a variable all-to-all would move 1/D of
//   that (the runtime has no all_to_allv yet).
// Prefill is this same step with all prompt tokens as queries. A prefill through the training
//   forward (TspAttention with a hook that captures each rank's zigzag K/V) is the alternative,
//   left for later: it would leave the cache where KvOwnership puts a zigzag prompt.
// Sequences are independent: every GEMM, norm and attention call is per sequence (one GEMM row's
//   bits can depend on the other rows of its call, reference/decode.hpp), and the collectives
//   are element-wise (all_reduce sums each element in rank order), so a sequence's logits do not
//   depend on its batch-mates, bitwise.
// Requirements: DecodeShape::validate(); world of D ranks; the master weights shaped as
//   ModelWeights::zeros(model); the same calls with the same arguments on every rank; prefill
//   before decode_step (a new prefill starts a new batch); not in a dry run. A decoder holds its
//   Rank and arena buffers, so it lives inside one World::run (construct, prefill and decode
//   there).
// Guarantees:
//   - logits [B, V] are bitwise identical on every rank (every value is all-reduced or
//     all-gathered), and runs are bitwise repeatable.
//   - Bad input throws std::invalid_argument (or std::length_error past max_context) naming the
//     sequence, position and value before anything is computed or cached: B prompts expected, an
//     empty prompt, a token outside [0, V), decode before prefill.
//   - kv_cache_bytes() is the arena's Category::kv_cache charge, closed form in rank_kv_cache.hpp.
// Cost per decode step (B tokens): weights read once per sequence (P/D per rank);
//   comm per rank per layer: all_gather route (D-1)/D·2·B·NKV·hs, all_gather q (D-1)/D·B·NH·hs,
//   all_to_all (D-1)/D·B·NH·(hs+1), two all_reduce of B·C; embedding all_reduce of B·C, LM head
//   all_gather (D-1)/D·B·V. Memory phases: "tspw.prefill", "tspw.decode".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/decoder_base.hpp"
#include "tspemu/tsp/kv_ownership.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"

namespace tspemu::tsp {

struct DecodeShape {
  ref::ModelConfig model;
  int D = 1;
  int batch = 1;
  std::int64_t max_context = 0;  // positions per sequence (prompt + generated), > 0
  int interleave = 1;            // I
  // std::invalid_argument naming the values: a valid model, D >= 1, batch >= 1,
  // max_context > 0, interleave >= 1, D | NH, D | NKV, D | F, D | V.
  void validate() const;
};

// What this rank's collectives moved in the last prefill or decode_step, by stage (summed over
// layers): the measured side of the planner's decode closed forms.
struct TspwTraffic {
  TrafficCounters embedding, kv_route, q_gather, partials, o_proj, mlp, lm_head;
  TrafficCounters total() const {
    return embedding + kv_route + q_gather + partials + o_proj + mlp + lm_head;
  }
};

// Test-only faults: broken schedules the checks must catch (tests/tsp/tspw_decoder_test.cpp).
enum class TspwFault {
  none,
  rope_local_positions,  // q and k rotated at the token's index among its owner's keys
  kv_wrong_owner,        // a generated token's K/V stored by the rank after its owner
  empty_shard_nan,       // a rank holding no key of a sequence returns NaN, not (0, -inf)
  o_proj_shard_swap,     // ranks 0 and 1 hold each other's W_O shard (a wrong group mapping)
};
// (Ranks sampling from different streams, the fifth broken schedule of issue 36, is no decoder
// fault: the decoder returns logits and never samples; the test's sampling loop breaks it.)

template <class T>
class BasicTspwDecoder final : public DecoderBase<T, DecodeShape, TspwTraffic> {
 public:
  BasicTspwDecoder(Rank& rank, const DecodeShape& shape, const ref::ModelWeights<T>& master,
                   TspwFault fault = TspwFault::none);
  ~BasicTspwDecoder() override;
  // prefill, decode_step, cache, kv_cache_bytes, length, last_traffic, shape: DecoderBase.

 private:
  using Base = DecoderBase<T, DecodeShape, TspwTraffic>;
  using Base::rank_, Base::s_, Base::cache_, Base::traffic_;
  struct Weights;
  struct Step;
  struct Scratch;
  CacheLayout cache_layout() const override;
  std::vector<T> forward(detail::DecodeStep&& step) override;
  void embed(const Step& st, Scratch& sc);
  void attention(int layer, const Step& st, Scratch& sc);
  void route(int layer, const Step& st, Scratch& sc);
  void merge_partials(const Step& st, Scratch& sc);
  void mlp(int layer, const Step& st, Scratch& sc);
  std::vector<T> lm_head(const Step& st, Scratch& sc);

  TspwFault fault_;
  std::unique_ptr<Weights> w_;
};

using TspwDecoder = BasicTspwDecoder<float>;
extern template class BasicTspwDecoder<float>;
extern template class BasicTspwDecoder<double>;

}  // namespace tspemu::tsp
