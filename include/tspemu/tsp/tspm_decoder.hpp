// BasicTspmDecoder: TSP-M inference (weights move, as in training) — prefill and decode of a batch
// of sequences on the D ranks of a world, with the key/value cache sharded over the sequence as
// TSP-W shards it (same KvOwnership, same RankKvCache: the two variants' caches are comparable
// position by position), checked token by token against the reference decoder
// (reference/decode.hpp) and the fp64 oracle (tests/tsp/tspm_decoder_test.cpp).
//
// Weights (as TSP training holds them, packed_shards.hpp; cut from the master): rank r holds head
//   shard r of the attention (W_Q, W_K, W_V, W_O packed), MLP shard r (gate, up, down packed),
//   rows [r·V/D, (r+1)·V/D) of the embedding and of the LM head, the norm weights whole. The
//   shards circulate every step as in the training forward (tsp_attention.hpp, tsp_mlp.hpp,
//   tsp_model.hpp); TSP-W (tspw_decoder.hpp) is the variant that keeps them in place
//   (../shared/INFERENCE-NOTES.md §1.3).
// Tokens: every new token of a step (prefill: every prompt token; decode: one per sequence) is
//   owned by the rank KvOwnership gives its (sequence, global position); a rank computes only its
//   own tokens' hidden rows, as a training rank computes only its sequence shard.
//
// One step, N new tokens, n_p of them owned by rank p, per rank r (letters of model_config.hpp;
// NHl = NH/D, NKVl = NKV/D, Fl = F/D, Vl = V/D):
//   embedding: for s in 0..D-1: broadcast of vocabulary shard s (root s); the owner of each token
//              copies its row when the id falls in shard s                          x [n_r, C]
//   per layer:
//     n = rmsnorm(x); mid = x
//     for s in 0..D-1 (head shard s):
//       broadcast of packed attention shard s (root s)
//       q, k, v = n·W_Q^(s)ᵀ, n·W_K^(s)ᵀ, n·W_V^(s)ᵀ of r's tokens; RoPE at global positions; k, v
//         kept in a staging row [NKV, hs] per own token (head slice s): no K/V ever moves
//       q gather: all_gatherv of q -> the step's N queries of head shard s on every rank
//       attend:   per sequence, its queries over r's keys of it in head slice s (the cached ones
//                 and this step's own new ones; the causal mask by global position); a rank with
//                 no visible key gives out 0, lse -inf
//       partials: (out, lse) of each token to its owner, point to point (an all-to-all with
//                 variable blocks: the runtime has no all_to_allv); the owner merges the D
//                 partials by log-sum-exp in rank order 0..D-1 (merge_attention_partials)
//       mid += att^(s)·W_O^(s)ᵀ                                 (no all-reduce: rows are r's own)
//     the staging rows are appended to r's cache (ascending positions per sequence)
//     mlp: n = rmsnorm(mid); x = mid; D-1 ring hops of the MLP shards (send to r+1, receive from
//          r-1, double buffered); at hop k shard o = (r-k) mod D: x += (silu(n·W_gate^(o)ᵀ) ⊙
//          n·W_up^(o)ᵀ)·W_down^(o)ᵀ (ring order, as TspMlp)
//   lm_head: final rmsnorm of each sequence's last new row (on its owner); for s in 0..D-1:
//            broadcast of LM head shard s (tied: the embedding's shard again, as training does),
//            the owner's logits of ids s·Vl..; all_gatherv of the owners' [V] rows -> [B, V]
// Collectives per step: 2D + 1 (vocabulary), and per layer D broadcasts, D all-gathers, D - 1 ring
//   hops (a send and a receive each) and the partials' messages (per shard one send to every
//   other rank owning a new token, one receive from every other rank if r owns one); by stage in
//   last_traffic(). The logits all-gather is TSP-M's one addition to the training
//   forward: the sampler runs on every rank (B·V elements a step, negligible beside the weights).
// Prefill is this same step with all prompt tokens (the queries of every rank gathered: pass-Q);
//   it leaves each rank with the K/V of all heads of its own prompt positions, where KvOwnership
//   says they are.
// Sequences are independent: every GEMM, norm and attention call is per sequence (rows of one
//   sequence on one rank), the merges are per token, so a sequence's logits do not depend on its
//   batch-mates, bitwise.
// Requirements: DecodeShape::validate() (messages prefixed "TSP-M decode"); world of D ranks; the
//   master weights shaped as ModelWeights::zeros(model); the same calls with the same arguments on
//   every rank; prefill before decode_step (a new prefill starts a new batch); not in a dry run.
//   A decoder holds its Rank and arena buffers, so it lives inside one World::run.
// Guarantees:
//   - logits [B, V] are bitwise identical on every rank (every row is all-gathered from its
//     owner), and runs are bitwise repeatable.
//   - Bad input throws std::invalid_argument (or std::length_error past max_context) naming the
//     sequence, position and value before anything is computed or cached: B prompts expected, an
//     empty prompt, a token outside [0, V), decode before prefill.
//   - The cache is TSP-W's: kv_cache_bytes() is the arena's Category::kv_cache charge, the closed
//     form of rank_kv_cache.hpp; cache() holds every post-RoPE K and V row where KvOwnership says.
//   - last_traffic() equals cost::tspm_step_stage_traffic (plan/decode_cost.hpp) on every rank.
// Cost per decode step: every rank's GEMMs read all P weights (each shard passes through);
//   comm per rank per layer: D broadcasts of P_attn/D (root sends (D-1)·P_attn/D), D-1 hops of
//   P_mlp/D, D all-gathers of the B queries' head shard (h/D each), D exchanges of the partials
//   (h/D + NH/D each); per step 2D vocabulary-shard broadcasts and the logits all-gather. One
//   attention shard, two MLP shards and one vocabulary shard in flight (Category::comm); the head
//   slice of the rank's cache is copied to one contiguous block per shard (the attention kernel
//   takes contiguous [Tk, NKV, hs] keys): one pass over the cache per layer. Memory phases:
//   "tspm.prefill", "tspm.decode".
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
#include "tspemu/tsp/tspw_decoder.hpp"  // DecodeShape

namespace tspemu::tsp {

// What this rank's collectives moved in the last prefill or decode_step, by stage (summed over
// layers): the measured side of cost::TspmStageTraffic.
struct TspmTraffic {
  TrafficCounters embedding, attention_shards, q_gather, partials, mlp_shards, lm_head, logits;
  TrafficCounters total() const {
    return embedding + attention_shards + q_gather + partials + mlp_shards + lm_head + logits;
  }
};

template <class T>
class BasicTspmDecoder final : public DecoderBase<T, DecodeShape, TspmTraffic> {
 public:
  BasicTspmDecoder(Rank& rank, const DecodeShape& shape, const ref::ModelWeights<T>& master);
  // DecodeShape::validate() with TSP-M named (std::invalid_argument "TSP-M decode: ...").
  static void validate(const DecodeShape& shape);
  ~BasicTspmDecoder() override;
  // prefill, decode_step, cache, kv_cache_bytes, length, last_traffic, shape: DecoderBase.

 private:
  using Base = DecoderBase<T, DecodeShape, TspmTraffic>;
  using Base::rank_, Base::s_, Base::cache_, Base::traffic_;
  struct Weights;
  struct Step;
  struct Scratch;
  CacheLayout cache_layout() const override;
  std::vector<T> forward(detail::DecodeStep&& step) override;
  void embed(const Step& st, Scratch& sc);
  void attention(int layer, const Step& st, Scratch& sc);
  void attend_shard(int layer, int shard, const Step& st, Scratch& sc);
  void exchange_partials(const Step& st, Scratch& sc);
  void mlp(int layer, const Step& st, Scratch& sc);
  std::vector<T> lm_head(const Step& st, Scratch& sc);

  std::unique_ptr<Weights> w_;
};

using TspmDecoder = BasicTspmDecoder<float>;
extern template class BasicTspmDecoder<float>;
extern template class BasicTspmDecoder<double>;

}  // namespace tspemu::tsp
