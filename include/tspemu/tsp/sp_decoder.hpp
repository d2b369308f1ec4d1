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
//   Prefill is the same step with every prompt token as a query (pass-Q prefill, Σ-fold redundant
//   projections and MLP). Ring pass-KV prefill (each rank computing only its own tokens, K/V
//   passed round the ring as ring_attention.hpp does in training) is the alternative; it is not
//   implemented.
// Requirements: validate_sp(shape) (SP's own rules: a valid model, D >= 1, batch >= 1,
//   max_context > 0, interleave >= 1; none of TSP-W's D | NH, NKV, F, V), a world of D ranks,
//   the master weights shaped as ModelWeights::zeros(model), the same calls on every rank,
//   prefill before decode_step, inside one World::run.
// Guarantees: as mesh_decoder.hpp (bad input named before anything is computed; logits bitwise
//   equal on every rank); last_traffic() has only the lse_gather and output_reduce stages, equal
//   to plan/decode_cost.hpp's decode_stage_traffic(sp(Σ)) per decode step (the LSE travels in T:
//   the planner's fp32 LSE is the float decoder's); kv_cache_bytes() =
//   round_up(2·L·NKV·hs·sizeof(T)·Σ_b count(r, b, max_context), 64).
// Cost per decode step (B tokens), per rank: all weights P read once per sequence, the K/V of
//   its ~S/Σ positions; comm per layer: all_gather of B·NH LSE values ((Σ-1)·B·NH received) and
//   all_reduce of B·C (2(Σ-1)/Σ·B·C). Memory phases "sp.prefill", "sp.decode".
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

// SP's rules for a DecodeShape (D = Σ), std::invalid_argument naming the value ("SP decode: ...").
void validate_sp(const DecodeShape& shape);
// The mesh shape SP runs as: T = 1, Σ = shape.D (after validate_sp).
MeshDecodeShape sp_mesh_shape(const DecodeShape& shape);

template <class T>
class BasicSpDecoder {
 public:
  BasicSpDecoder(Rank& rank, const DecodeShape& shape, const ref::ModelWeights<T>& master)
      : mesh_(rank, sp_mesh_shape(shape), master) {}

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
