// RowDecoder: the bookkeeping every sequence-sharded decode schedule repeats, as a RankDecoder
// base (decode_check.hpp), so a schedule is its step() alone.
//
// What: prefill(prompts) and decode_step(tokens) become one call of step(rows) with the step's new
//   tokens as rows, sequence-major: the prefill's rows are every prompt token of sequence b at
//   global positions 0..P_b-1, a decode step's one row per sequence at its next position. The base
//   keeps each sequence's length, and this rank's shard of a KV cache (tsp::RankKvCache, in arena
//   memory of Category::kv_cache) made at each prefill with positions owned as tsp::KvOwnership
//   says (prompt zigzag when 2D | P_b, else contiguous blocks; generated tokens round-robin in
//   blocks of `interleave`) and reserved up to DecodeRank::max_context(); kv_cache() hands it to
//   check_decode's cache check. step() appends to cache() the K/V of the rows this rank owns.
//   The two ends of a step every schedule shares are here too:
//     embed(rows, x)    x [rows, C] = the embedding rows of the rows' tokens (the embedding
//                       replicated, copied into this rank's arena at the first call);
//     logits(rows, x)   the final norm of each sequence's LAST row of x [rows, C] and the LM head
//                       vocab-parallel: this rank's V/D rows (copied at the first call), the B·V/D
//                       logits all-gathered in rank order -> [B, V], bitwise identical on every
//                       rank (the kit requires it). Collective: every rank calls it; D | V.
//   And the middle pieces a flash-decoding schedule over a sequence-sharded cache shares (TSP-W,
//   a DCP, Helix's KVP group over the whole world):
//     attend_local(layer, rows, q, out, lse)   each row's query [NH, hs] over this rank's keys of
//                       its sequence in cache(), masked by global position: out [rows, NH, hs],
//                       lse [rows, NH]; no key here: out 0, lse -inf (an empty partial);
//     merge_at_head_owners(rows, out, lse, att) one all_to_all sends head block p (NH/D heads) of
//                       every rank's partials to rank p, which merges the D of them by log-sum-exp
//                       in rank order 0..D-1 (ref::merge_attention_partials; an empty partial
//                       changes nothing) into att [rows, NH/D·hs]. Collective; D | NH;
//     add_all_reduced(part, x)  x [rows, C] += all_reduce(part): a row-parallel GEMM's partials;
//     tp_mlp(w, rows, x)  the MLP as Megatron TP with this rank's TpLayer shard: x += all_reduce(
//                       (silu(n·w_gateᵀ) ⊙ n·w_upᵀ)·w_downᵀ), n = rmsnorm(x) by w.post_norm.
// Requirements: constructed inside the check's run on the rank of `dr` (it holds arena memory);
//   prefill before decode_step; one token per sequence in [0, V) per decode step.
// Guarantees: bad input (decode before prefill, a token count that is not B, a token outside
//   [0, V), a position at max_context) throws std::invalid_argument or std::length_error naming
//   the rank, sequence, position and value before step() runs; lengths advance only after step()
//   returns.
// Cost: O(rows) per step besides step(); the cache reservation of rank_kv_cache.hpp; logits():
//   B GEMV rows of [V/D, C] and one all_gather of B·V/D floats per rank; merge_at_head_owners: one
//   all_to_all of rows·(NH·hs + NH) floats per rank; tp_mlp: 3 GEMMs of [rows, C] × [F/D, C] and
//   one all_reduce of rows·C floats.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tspemu/check/decode_check.hpp"
#include "tspemu/tsp/kv_ownership.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"

namespace tspemu::check {

// One new token of a step: sequence, global position, token id.
struct DecodeRow {
  int seq = 0;
  std::int64_t pos = 0;
  std::int32_t token = 0;
};

class RowDecoder : public RankDecoder {
 public:
  explicit RowDecoder(DecodeRank& dr, int interleave = 1);
  std::vector<float> prefill(const Prompts& prompts) final;
  std::vector<float> decode_step(std::span<const std::int32_t> tokens) final;
  const tsp::RankKvCache<float>* kv_cache() const override { return cache_.get(); }

 protected:
  // Runs one step of `rows` and returns the logits [B, V] at each sequence's last row.
  virtual std::vector<float> step(std::span<const DecodeRow> rows) = 0;
  tsp::RankKvCache<float>& cache() { return *cache_; }
  const tsp::KvOwnership& ownership() const { return cache_->ownership(); }
  int batch() const { return static_cast<int>(length_.size()); }
  void embed(std::span<const DecodeRow> rows, float* x);
  std::vector<float> logits(std::span<const DecodeRow> rows, const float* x);
  void attend_local(int layer, std::span<const DecodeRow> rows, const float* q, float* out,
                    float* lse);
  void merge_at_head_owners(std::span<const DecodeRow> rows, const float* out, const float* lse,
                            float* att);
  void add_all_reduced(std::span<float> part, float* x);
  void tp_mlp(const TpLayer& w, std::span<const DecodeRow> rows, float* x);
  DecodeRank& dr_;

 private:
  int interleave_;
  Buffer<float> embed_, head_, final_norm_;  // allocated at their first use
  std::vector<std::int64_t> length_;         // [B]
  std::unique_ptr<tsp::RankKvCache<float>> cache_;
};

}  // namespace tspemu::check
