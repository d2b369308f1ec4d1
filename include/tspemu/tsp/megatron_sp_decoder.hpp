// BasicMegatronSpDecoder: Megatron tensor parallelism with sequence parallelism (Megatron-SP) for
// inference — prefill and decode of a batch of sequences on the T ranks of a world, the hidden
// state between the blocks sharded over the step's token rows, checked token by token against the
// reference decoder (reference/decode.hpp) and the fp64 oracle
// (tests/tsp/megatron_sp_decoder_test.cpp).
//
// Shape, weights, KV cache: TP's (tp_decoder.hpp), with its rule validate_tp (T | NH, F, V; T |
// NKV,
//   or NKV | T with each KV head's weights and cache duplicated T/NKV times): column-parallel
//   W_Q/K/V and gate/up, row-parallel W_O and down, vocabulary rows r·V/T.., the norms whole; every
//   position of the rank's NKVl = max(NKV/T, 1) KV heads cached (post-RoPE, global positions).
// Token rows: a step's N new rows (prefill: every prompt token; decode: one per sequence) are
//   padded with zero rows to Np = ceil(N/T)·T and cut into T contiguous pieces of Nl = Np/T
//   (Megatron's order): rank r owns rows [r·Nl, (r+1)·Nl) of the residual stream.
//   Why pad, not refuse: a decode step has N = B rows, and B is the number of sequences a server
//   happens to hold; refusing T ∤ B would refuse B = 1 — single-sequence decode — at every T > 1.
//   Padding costs (Np − N)·C·β more bytes per collective and nothing else: a zero row stays zero
//   through the norm (0·rstd, rstd finite by eps), is never a GEMM row (the GEMMs run per
//   sequence on the gathered rows 0..N−1), and never reaches the cache or the logits.
//
// One step, per rank r (letters of model_config.hpp; NHl = NH/T):
//   x_r = reduce_scatter(rows of r's vocabulary shard, zeros elsewhere)   [Nl, C] exact
//   per layer:
//     n_r = rmsnorm(x_r); n = all_gather(n_r) [Np, C]; q, k, v = n·W_Q^(r)ᵀ, n·W_K^(r)ᵀ, n·W_V^(r)ᵀ
//       per sequence; rope at global positions; append k, v of every new token to the cache
//     attend: per sequence, its queries over all its cached keys (causal by global position)
//     mid_r = x_r + reduce_scatter(att^(r)·W_O^(r)ᵀ [Np, C])                  (row-parallel)
//     n_r = rmsnorm(mid_r); n = all_gather(n_r); x_r = mid_r + reduce_scatter(mlp^(r)(n))
//   lm_head: x = all_gather(x_r) [Np, C]; rmsnorm of each sequence's last row (the B rows the LM
//     head reads, normed after the gather: the same per-row norm, no norm of unused rows); logits
//     of r's V/T ids; all_gather -> [B, V] (TP's).
// Collectives per step: 3 + 4·L in 7 stages (last_traffic()), equal stage by stage on every rank to
//   plan/decode_cost.hpp's decode_stage_traffic(megatron_sp(T)) for a decode step and to
//   megatron_sp_prefill_stage_traffic for a prefill. T = 1: no collective.
// Requirements: validate_megatron_sp(shape) (TP's rules); a world of T ranks; master weights shaped
//   as ModelWeights::zeros(model); the same calls with the same arguments on every rank; prefill
//   before decode_step (a new prefill starts a new batch); not in a dry run. The decoder holds its
//   Rank and arena buffers: it lives inside one World::run.
// Guarantees:
//   - logits [B, V] bitwise identical on every rank (all-gathered), runs bitwise repeatable (the
//     reduce-scatter sums in rank order), a sequence's logits independent of its batch-mates,
//     bitwise (per-row norms, per-sequence GEMMs, element-wise collectives).
//   - Bad input throws std::invalid_argument (std::length_error past max_context) naming the
//     sequence, position and value before anything is computed or cached.
//   - kv_cache_bytes() = TP's: round_up(2·L·NKVl·hs·sizeof(T)·B·max_context, 64).
// Cost per decode step (B tokens), per rank: weights P/T read once per sequence; per layer two
//   all_gather and two reduce_scatter of Np·C ((T−1)/T of it each), TP's two all_reduce volume
//   when T | B; embedding reduce_scatter and LM head all_gather of Np·C, logits all_gather
//   (T−1)/T·B·V. Activations between blocks: Nl·C per rank where TP keeps N·C. Memory phases
//   "megatron_sp.prefill", "megatron_sp.decode".
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

namespace detail {
template <class T>
struct TpShards;  // tsp/decode_parts.hpp: TP's weight shards, which this decoder holds
}  // namespace detail

// TP's rules (validate_tp) with T = s.D; std::invalid_argument "Megatron-SP decode: ..." naming
// the values.
void validate_megatron_sp(const DecodeShape& s);

// What this rank's collectives moved in the last prefill or decode_step, by stage (summed over
// layers), under the planner's names: embedding "embedding reduce-scatter", qkv_gather "QKV input
// all-gather", o_proj "W_O reduce-scatter", mlp_gather "MLP input all-gather", mlp "MLP down
// reduce-scatter", head_gather "LM head input all-gather", lm_head "LM head logits all-gather".
struct MegatronSpTraffic {
  TrafficCounters embedding, qkv_gather, o_proj, mlp_gather, mlp, head_gather, lm_head;
  TrafficCounters total() const {
    return embedding + qkv_gather + o_proj + mlp_gather + mlp + head_gather + lm_head;
  }
};

template <class T>
class BasicMegatronSpDecoder final : public DecoderBase<T, DecodeShape, MegatronSpTraffic> {
 public:
  BasicMegatronSpDecoder(Rank& rank, const DecodeShape& shape, const ref::ModelWeights<T>& master);
  ~BasicMegatronSpDecoder() override;
  // prefill, decode_step, cache, kv_cache_bytes, length, last_traffic, shape: DecoderBase.

  int first_kv_head() const;  // the model's KV head of the cache's head 0

 private:
  using Base = DecoderBase<T, DecodeShape, MegatronSpTraffic>;
  using Base::rank_, Base::s_, Base::cache_, Base::traffic_;
  struct Pass;  // one step's new tokens, padding and scratch buffers
  CacheLayout cache_layout() const override;
  std::vector<T> forward(detail::DecodeStep&& step) override;
  void attention(int layer, Pass& pass);
  void mlp(int layer, Pass& pass);

  std::unique_ptr<detail::TpShards<T>> w_;
};

using MegatronSpDecoder = BasicMegatronSpDecoder<float>;
extern template class BasicMegatronSpDecoder<float>;
extern template class BasicMegatronSpDecoder<double>;

}  // namespace tspemu::tsp
