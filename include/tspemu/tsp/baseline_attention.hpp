// BaselineAttention: one rank's part of the attention block y = x + o_proj(attn(norm(x))) under
// TP (Megatron), TP + Megatron-SP, SP (context parallel) or TP+SP — the T × Sp mesh of
// baseline_shape.hpp. Rank (row, col) holds head shard col of W_Q, W_K, W_V (column-parallel)
// and W_O (row-parallel), packed as a TSP shard (packed_shards.hpp), and the tokens of row's
// zigzag sequence shard (replicated over the row; with Megatron-SP only its contiguous piece).
//
// Forward:
//   N   = norm(X)  [B, Tl, C]                TP: on the replicated tokens (every rank of the row
//                                            computes it); Megatron-SP: on the piece, then
//                                            all_gather(tp) of the normed pieces
//   Q, K, V = N·W_Qᵀ, N·W_Kᵀ, N·W_Vᵀ; RoPE at the tokens' global positions (local heads only)
//   K_all, V_all = all_gather(sp) of K, V, reordered by global position   (Sp > 1 only)
//   A = causal_attention(Q, K_all, V_all)     local heads, the row's queries, the full sequence
//   Y   = X + Σ_row A·W_Oᵀ                   all_reduce(tp); Megatron-SP: reduce_scatter(tp)
// Backward (the adjoint): dY all_gather(tp) under Megatron-SP; dA = dY·W_O, dW_O = dYᵀA;
// Q, K, V recomputed from the kept N (and K/V re-gathered over sp, as TSP does); attention
// backward gives dK, dV of the full sequence, reduce-scattered (sp) back to their token owners;
// dN = dQ·W_Q + dK·W_K + dV·W_V over the local heads, all_reduce(tp) (Megatron-SP:
// reduce_scatter(tp)), then the norm backward and the residual.
// Gradients: the weight shard's gradient is complete within a row (its heads see all of the
// row's tokens) and partial across rows → all_reduce(sp) if Sp > 1, so every rank of a column
// holds it. Norm weight (replicated): TP without Megatron-SP — every rank of a row sees the same
// tokens and the same all-reduced dN, so its partial is bitwise equal across the row and is NOT
// all-reduced over tp (that would multiply it by T); it is all-reduced over sp. Megatron-SP —
// each rank's piece holds different tokens: all_reduce over every rank. All reductions are in
// rank order: results are bitwise reproducible.
// Kept for backward (Category::activations): N [B·Tl, C], rstd, A [B·Tl, NHl·hs], softmax
// statistics [B, NHl, Tl]. Under Megatron-SP N is kept gathered ([B·Tl, C], not the piece):
// Megatron-LM keeps the piece and all-gathers it again in backward; here backward needs no
// second all_gather of N. Transient: Q/K/V and dQ/dK/dV (workspace), the gathered and
// position-ordered full-sequence K/V [B, S, NKVl·hs] and their gradients (kv), the pieces in
// flight and the partial o_proj output (comm/workspace).
// Memory phases recorded in the arena: "attention" (forward), "attention.backward".
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"
#include "tspemu/tsp/parameter_shard.hpp"

namespace tspemu::tsp {

namespace detail {
class MeshRegion;
}

class BaselineAttention {
 public:
  // Collective: splits the world into the row (tp) and column (sp) groups. Cuts this rank's
  // shard and the replicated norm weight from the master layer.
  BaselineAttention(Rank& rank, const BaselineShape& shape, const ref::LayerWeights<float>& master);
  ~BaselineAttention();

  void forward(const float* x, float* y);  // [B, rows(), C] (BaselineShape::positions)
  // x: forward's input; dy: gradient of y; dx overwritten; gradients overwritten.
  void backward(const float* x, const float* dy, float* dx);

  const Buffer<float>& grad_shard() const { return grad_; }      // packed like the weights
  const Buffer<float>& grad_norm() const { return grad_norm_; }  // [C], complete on every rank
  const Buffer<float>& weight_shard() const { return w_; }
  // The weight shard ("attention") and the replicated norm weight ("input_norm"), with their
  // gradients, for the optimizer (sharded_optimizer.hpp).
  std::array<ParameterShard, 2> parameters() {
    return {{{"attention", w_.span(), grad_.span(), false, true},
             {"input_norm", norm_w_.span(), grad_norm_.span(), true, false}}};
  }

 private:
  void project_q(float* q);
  void project_kv(float* k, float* v);
  // K/V of the full sequence, by global position: gathered over sp into `gathered` and reordered
  // into k_all/v_all, or (Sp = 1) the local K/V themselves.
  void gather_kv(const float* kv_local, float* gathered, float* k_all, float* v_all);

  Rank& rank_;
  BaselineShape s_;
  TspShape shard_;
  std::unique_ptr<detail::MeshRegion> region_;
  Buffer<std::int64_t> positions_;    // [Tl] global positions of the row's tokens (other)
  Buffer<std::int64_t> k_positions_;  // [S] 0..S-1 (other)
  Buffer<float> w_;                   // packed head shard col (weights)
  Buffer<float> norm_w_;              // [C] (weights, replicated)
  Buffer<float> grad_;                // packed (gradients)
  Buffer<float> grad_norm_;           // [C] (gradients)
  Buffer<float> xn_;                  // [B·Tl, C] (activations)
  Buffer<float> rstd_;                // [B·rows] (activations)
  Buffer<float> att_;                 // [B·Tl, NHl·hs] (activations)
  Buffer<float> lse_;                 // [B, NHl, Tl] (activations)
};

}  // namespace tspemu::tsp
