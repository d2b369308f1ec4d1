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
// Requirements: constructed inside the check's run on the rank of `dr` (it holds arena memory);
//   prefill before decode_step; one token per sequence in [0, V) per decode step.
// Guarantees: bad input (decode before prefill, a token count that is not B, a token outside
//   [0, V), a position at max_context) throws std::invalid_argument or std::length_error naming
//   the rank, sequence, position and value before step() runs; lengths advance only after step()
//   returns.
// Cost: O(rows) per step besides step(); the cache reservation of rank_kv_cache.hpp; logits():
//   B GEMV rows of [V/D, C] and one all_gather of B·V/D floats per rank.
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
  DecodeRank& dr_;

 private:
  int interleave_;
  Buffer<float> embed_, head_, final_norm_;  // allocated at their first use
  std::vector<std::int64_t> length_;         // [B]
  std::unique_ptr<tsp::RankKvCache<float>> cache_;
};

}  // namespace tspemu::check
