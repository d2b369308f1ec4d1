// BasicSpDecoder: SP / context-parallel inference — prefill and decode of a batch of sequences on
// the Σ ranks of a world with every weight replicated and the key/value cache sharded over the
// sequence; pass-Q decode (INFERENCE-NOTES.md §1.4's "SP/CP (Σ), weights replicated").
//
// What: the TP+SP mesh decoder (mesh_decoder.hpp) with T = 1, Σ = DecodeShape::D; its header has
//   the step stage by stage. In short, per rank and step of N new tokens:
//   - every rank computes the embedding, Q/K/V, o_proj and MLP of the N tokens redundantly
//     (weights replicated: no TP collective, no vocabulary collective);
//   - the cache is KvOwnership(Σ, I, prompt lengths), the TSP-W layout (kv_ownership.hpp): each
//     new token's owner keeps its post-RoPE K/V of all NKV heads, the others drop it: no traffic;
//   - pass-Q attention: the N queries attend this rank's keys (out 0, lse -inf where a rank
//     holds no visible key: an empty partial, never NaN); merge by an all_gather of the LSE
//     [NH, N], every rank folding the global LSE in rank order and scaling its partial by
//     exp(lse - LSE), then an all_reduce of the scaled outputs [N, C] (summed in rank order), so
//     every rank gets the same logits, bitwise, and runs are bitwise repeatable.
// Prefill, three variants (the constructor's SpPrefill; decode is pass-Q whichever), all leaving
//   each rank's cache as decode expects it — KvOwnership's prompt positions, post-RoPE K/V of
//   all NKV heads at global positions:
//   - pass_q (default): the decode step with every prompt token as a query; each rank computes
//     every token's projections and MLP (Σ-fold redundant), keeps its own tokens' K/V and
//     attends all queries to them; merge as decode. Traffic per layer: LSE all-gather of N·NH,
//     all-reduce of N·C (N = Σ_b P_b).
//   - ring (pass-KV, Meta's CP prefill; the training core ring_attention.hpp's schedule): each
//     rank computes only its N_p own tokens (zigzag when 2Σ | P_b: every rank the same causal
//     work); per layer its K/V block goes round the ring in Σ-1 hops overlapped with the
//     attention of the block in hand, partials merged by log-sum-exp locally. Traffic per layer:
//     Σ-1 sends of the blocks of ranks p, p-1, .. (2·NKV·hs·(N - N_{p+1}) elements in all) and
//     Σ-1 receives (2·NKV·hs·(N - N_p)): K/V, not Q — by Meta's rule (INFERENCE-NOTES.md §1.2)
//     a full prefill moves fewer bytes passing K/V once g = NH/NKV >= 2; with MHA pass-Q wins.
//   - ulysses (DeepSpeed-Ulysses; the training core ulysses_attention.hpp's exchange): each rank
//     computes its own tokens; per layer all-to-all of Q, K, V sequence→heads (rank p then holds
//     NH/Σ heads of every token), full causal attention per sequence on those heads, output
//     heads→sequence. Each rank's tokens are padded to M = Σ_b ceil(P_b/Σ) slots (blocks layouts
//     give ranks unequal counts). Traffic per layer: 4 all-to-alls, (Σ-1)/Σ·M·(2·NH + 2·NKV)·hs
//     elements each way. Needs Σ | NH and Σ | NKV: other shapes are refused by
//     validate_sp_prefill, naming Σ, NH and NKV.
//   ring and ulysses then all-reduce the B last rows [B, C] once (one rank holds each) so every
//   rank computes the logits. The closed forms: plan/decode_cost.hpp's sp_prefill_stage_traffic,
//   equal to last_traffic() after prefill on every rank (the float decoder's; the LSE travels
//   in T). Where the prefill variants' sums differ (merge order, attention block split), the
//   cache and logits differ by rounding only: tested under the same bounds as pass-Q.
// Requirements: validate_sp_prefill(shape, prefill) (SP's own rules: a valid model, D >= 1,
//   batch >= 1, max_context > 0, interleave >= 1; none of TSP-W's D | NH, NKV, F, V; Ulysses
//   prefill: D | NH and D | NKV), a world of D ranks, the master weights shaped as
//   ModelWeights::zeros(model), the same calls on every rank, prefill before decode_step, inside
//   one World::run.
// Guarantees: as mesh_decoder.hpp (bad input named before anything is computed; logits bitwise
//   equal on every rank); after a decode step last_traffic() has only the lse_gather and
//   output_reduce stages, equal to plan/decode_cost.hpp's decode_stage_traffic(sp(Σ)) (the LSE
//   travels in T: the planner's fp32 LSE is the float decoder's); after a prefill, the stages of
//   sp_prefill_stage_traffic (kv_ring or heads_exchange and last_rows for ring and Ulysses);
//   kv_cache_bytes() =
//   round_up(2·L·NKV·hs·sizeof(T)·Σ_b count(r, b, max_context), 64).
// Cost per decode step (B tokens), per rank: all weights P read once per sequence, the K/V of
//   its ~S/Σ positions; comm per layer: all_gather of B·NH LSE values ((Σ-1)·B·NH received) and
//   all_reduce of B·C (2(Σ-1)/Σ·B·C). Prefill compute per rank: pass_q all N tokens' GEMMs,
//   ring and ulysses the ~N/Σ own ones'. Memory phases "sp.prefill", "sp.decode".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/mesh_decoder.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"
#include "tspemu/tsp/tspw_decoder.hpp"

namespace tspemu::tsp {

// SP's rules for a DecodeShape (D = Σ), std::invalid_argument naming the value ("SP decode: ...");
// validate_sp_prefill adds the prefill variant's (Ulysses: Σ | NH, Σ | NKV).
void validate_sp(const DecodeShape& shape);
void validate_sp_prefill(const DecodeShape& shape, SpPrefill prefill);
// The mesh shape SP runs as: T = 1, Σ = shape.D (after validate_sp).
MeshDecodeShape sp_mesh_shape(const DecodeShape& shape, SpPrefill prefill = SpPrefill::pass_q);

template <class T>
class BasicSpDecoder {
 public:
  BasicSpDecoder(Rank& rank, const DecodeShape& shape, const ref::ModelWeights<T>& master,
                 SpPrefill prefill = SpPrefill::pass_q)
      : mesh_(rank, sp_mesh_shape(shape, prefill), master) {}

  // Same prompts on every rank; logits [B, V] at each prompt's last position.
  std::vector<T> prefill(const std::vector<std::vector<std::int32_t>>& prompts) {
    return mesh_.prefill(prompts);
  }
  // tokens [B], the same on every rank; logits [B, V].
  std::vector<T> decode_step(std::span<const std::int32_t> tokens) {
    return mesh_.decode_step(tokens);
  }
  const RankKvCache<T>& cache() const { return mesh_.cache(); }  // all NKV heads
  std::size_t kv_cache_bytes() const { return mesh_.kv_cache_bytes(); }
  std::int64_t length(int seq) const { return mesh_.length(seq); }
  const MeshTraffic& last_traffic() const { return mesh_.last_traffic(); }

 private:
  BasicMeshDecoder<T> mesh_;
};

using SpDecoder = BasicSpDecoder<float>;

}  // namespace tspemu::tsp
