// BasicMeshDecoder: TP+SP mesh inference — prefill and decode of a batch of sequences on the
// T × Σ ranks of a world, tensor parallel over each row of T ranks and context parallel (pass-Q)
// over each column of Σ ranks, with the key/value cache of each head shard sharded over the
// sequence by KvOwnership over Σ. T = 1 is SP / context parallel (sp_decoder.hpp).
//
// Mesh (as baseline_shape.hpp): world rank r sits at row σ = r / T, column t = r % T. A row is a
//   TP group (T consecutive ranks), a column an SP group (Σ ranks, ordered by row).
// Weights (cut from the master, packed_shards.hpp at degree T): rank (σ, t) holds head shard t of
//   W_Q, W_K, W_V (column-parallel) and W_O (row-parallel), MLP shard t of gate/up (column) and
//   down (row), rows [t·V/T, (t+1)·V/T) of the embedding and of the LM head, and the norm weights
//   whole; the Σ ranks of a column hold the same shard. Nothing moves. T = 1: every rank holds
//   every weight (replicated).
// Cache: KV heads [t·NKVl, (t+1)·NKVl) of every position that KvOwnership(Σ, I, prompt lengths)
//   gives row σ (the TSP-W layout over Σ ranks: prompt zigzag when 2Σ | P_b, else contiguous
//   blocks; generated tokens round-robin in blocks of I), post-RoPE at the global position.
//   Every rank of a column computes the K/V of every new token of its head shard; the token's
//   owner row keeps it: no traffic.
//
// One step (prefill: every prompt token; decode: one token per sequence), N new tokens, per rank
// (σ, t) (letters of model_config.hpp; NHl = NH/T, NKVl = NKV/T, Fl = F/T, Vl = V/T):
//   x = embedding rows [N, C]: T = 1 copied; T > 1 all_reduce over the row of the rows of t's
//       vocabulary shard, zeros elsewhere (exact)
//   per layer:
//     n = rmsnorm(x); q, k, v = n·W_Q^(t)ᵀ, n·W_K^(t)ᵀ, n·W_V^(t)ᵀ  [N, NHl|NKVl, hs], computed
//       by every rank of the column; rope(q, k) at the global positions
//     append: each new token's owner row appends its k, v [NKVl, hs] to its cache
//     attend: per sequence, its queries over THIS rank's keys of it (causal_attention_forward
//       with the global positions of queries and keys: a multi-token step's causal mask is by
//       global position); a rank with no visible key gives out 0, lse -inf
//     merge (pass-Q, Σ > 1): all_gather over the column of lse [NHl, N]; every rank computes
//       LSE = m + log Σ_p exp(lse_p - m), m = max_p lse_p, in column order 0..Σ-1, and scales
//       its out by exp(lse_own - LSE) (0 for an empty partial: never NaN); all_reduce over the
//       column of out [N, NHl·hs] (summed in column order: bitwise the same on every rank)
//     o_proj: att·W_O^(t)ᵀ [N, C], all_reduce over the row (T > 1); mid = x + it
//     mlp: n = rmsnorm(mid); (silu(n·W_gate^(t)ᵀ) ⊙ n·W_up^(t)ᵀ)·W_down^(t)ᵀ, all_reduce over the
//       row (T > 1); x = mid + it
//   lm_head: rmsnorm of each sequence's last new row; logits of t's Vl ids; T > 1 all_gather
//     over the row -> [B, V]
// Prefill (shape.prefill):
//   pass_q   this same step with every prompt token as a query: each rank computes every prompt
//            token's projections and MLP (Σ-fold redundant) and attends them to its own keys.
//   ring, ulysses (T = 1 only): the step's rows are this rank's own prompt tokens (KvOwnership's
//            positions: zigzag or blocks, so the cache is born where decode expects it, every
//            computed K/V kept, no routing); the attend + merge stage is replaced by
//            sequence_prefill.hpp's ring pass-KV (K/V blocks round the Σ ranks, partials merged
//            locally) or Ulysses (all-to-all sequence↔heads over padded slots); the embedding,
//            norms, projections, o_proj and MLP run on the own rows only (no redundancy). The
//            logits need each sequence's last row, which one rank holds: an all-reduce over the
//            column of [B, C] (the holder's row, zeros elsewhere: exact) precedes the LM head.
//            Traffic: plan/decode_cost.hpp's sp_prefill_stage_traffic. Σ = 1 runs pass_q.
// Sequences are independent: every GEMM, norm and attention call is per sequence and the
//   collectives are element-wise in a fixed rank order, so a sequence's logits do not depend on
//   its batch-mates, bitwise.
// Requirements: MeshDecodeShape::validate(); a world of T·Σ ranks; the master weights shaped as
//   ModelWeights::zeros(model); the same calls with the same arguments on every rank; prefill
//   before decode_step (a new prefill starts a new batch); not in a dry run. A decoder holds its
//   Rank, sub-communicators and arena buffers, so it lives inside one World::run.
// Guarantees:
//   - logits [B, V] bitwise identical on every rank, and runs bitwise repeatable.
//   - Bad input throws std::invalid_argument (std::length_error past max_context) naming the
//     sequence, position and value before anything is computed or cached: B prompts expected, an
//     empty prompt, a token outside [0, V), decode before prefill.
//   - kv_cache_bytes() is the arena's Category::kv_cache charge (rank_kv_cache.hpp):
//     round_up(2·L·NKVl·hs·sizeof(T)·Σ_b count(σ, b, max_context), 64).
//   - last_traffic() is what this rank's collectives moved in the last prefill or decode_step,
//     by stage; for a decode step each stage equals the one of plan/decode_cost.hpp's
//     decode_stage_traffic(sp(Σ) or tp_sp(T, Σ)) of the same collective ("embedding all-reduce",
//     "LSE all-gather", "attention output all-reduce", "W_O all-reduce", "MLP down all-reduce",
//     "LM head logits all-gather"; the LSE travels in T: the planner's fp32 LSE is the float
//     decoder's).
// Cost per decode step (B tokens), per rank: weights P/T read once per sequence; KV of its head
//   shard over its positions; comm per layer: T > 1 two all_reduce of B·C over the row; Σ > 1
//   all_gather of B·NHl LSE and all_reduce of B·C/T over the column; per step T > 1 all_reduce of
//   B·C (embedding) and all_gather of B·V/T logits over the row. Memory phases "sp.prefill",
//   "sp.decode" (T = 1), "tp_sp.prefill", "tp_sp.decode" (T > 1).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/decoder_base.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"

namespace tspemu::tsp {

// How the prompts are processed (plan/decode_cost.hpp states each and its traffic): pass_q (every
// rank computes every prompt token), ring (pass-KV) or ulysses (each rank computes its own).
using SpPrefill = cost::SpPrefill;

struct MeshDecodeShape {
  ref::ModelConfig model;
  int T = 1;   // tensor-parallel degree (ranks in a row)
  int Sp = 1;  // sequence-parallel degree Σ (ranks in a column)
  int batch = 1;
  std::int64_t max_context = 0;  // positions per sequence (prompt + generated), > 0
  int interleave = 1;            // I
  SpPrefill prefill = SpPrefill::pass_q;
  int ranks() const { return T * Sp; }
  // "SP" when T = 1, else "TP+SP": the label of error messages.
  const char* label() const { return T == 1 ? "SP" : "TP+SP"; }
  // std::invalid_argument naming the values: a valid model, T, Σ, batch, interleave >= 1,
  // max_context > 0; T | NH, T | NKV (each rank holds whole KV heads: duplicating KV heads past
  // T = NKV is not implemented), T | F, T | V.
  void validate() const;
};

// What this rank's collectives moved in the last prefill or decode_step, by stage (summed over
// layers); the row stages are empty when T = 1, the column stages when Σ = 1. kv_ring ("K/V
// ring"), heads_exchange ("sequence-heads all-to-all") and last_rows ("last rows all-reduce") are
// a ring or Ulysses prefill's (sp_prefill_stage_traffic's names), empty otherwise.
struct MeshTraffic {
  TrafficCounters embedding, lse_gather, output_reduce, o_proj, mlp, lm_head;
  TrafficCounters kv_ring, heads_exchange, last_rows;
  TrafficCounters total() const {
    return embedding + lse_gather + output_reduce + o_proj + mlp + lm_head + kv_ring +
           heads_exchange + last_rows;
  }
};

template <class T>
class BasicMeshDecoder final : public DecoderBase<T, MeshDecodeShape, MeshTraffic> {
 public:
  BasicMeshDecoder(Rank& rank, const MeshDecodeShape& shape, const ref::ModelWeights<T>& master);
  ~BasicMeshDecoder() override;
  // prefill, decode_step, cache, kv_cache_bytes, length, last_traffic, shape: DecoderBase. This
  // rank's cache holds KV heads [col·NKVl, (col+1)·NKVl) of row()'s positions; its rank() is
  // row().

  int row() const { return row_; }  // σ: the rank's place in its column (SP group)
  int col() const { return col_; }  // t: the rank's place in its row (TP group), its head shard

 private:
  using Base = DecoderBase<T, MeshDecodeShape, MeshTraffic>;
  using Base::rank_, Base::s_, Base::cache_, Base::lengths_, Base::traffic_;
  struct Weights;
  struct Step;
  struct Scratch;
  CacheLayout cache_layout() const override;
  std::vector<T> forward(detail::DecodeStep&& step) override;
  void attention(int layer, const Step& st, Scratch& sc);
  void attend_local(int layer, const Step& st, Scratch& sc);
  void merge_partials(const Step& st, Scratch& sc);
  std::vector<T> last_rows_logits(const Step& st, const Scratch& sc);
  [[noreturn]] void reject(const std::string& why) const;

  int row_ = 0, col_ = 0;
  Comm tp_, sp_;  // the row (T ranks) and the column (Σ ranks)
  std::unique_ptr<Weights> w_;
};

using MeshDecoder = BasicMeshDecoder<float>;
extern template class BasicMeshDecoder<float>;
extern template class BasicMeshDecoder<double>;

}  // namespace tspemu::tsp
