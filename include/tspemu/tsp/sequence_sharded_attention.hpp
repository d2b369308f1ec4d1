// SequenceShardedAttention: one rank's part of the attention block y = x + o_proj(attn(norm(x)))
// when the tokens are sequence-sharded and the weights replicated, with the attention core
// replaceable (ref::AttentionCore): DeepSpeed-Ulysses (ulysses_attention.hpp) and ring attention
// (ring_attention.hpp) are this block with their core. Only the core talks to other ranks in
// forward; everything else is the reference block on this rank's tokens.
//
// Shape: an SP shape of baseline_shape.hpp (T = 1, Sp = n = ranks, no sequence_parallel): rank p
// holds the zigzag shard p (row_layout(), contiguous when n = 1), Tl = S/n tokens per sequence.
// Forward (M = B·Tl local token rows):
//   N = norm(X) [M, C];  Q, K, V = N·W_Qᵀ, N·W_Kᵀ, N·W_Vᵀ, RoPE at the global positions
//   A, lse = core(Q, K, V)                     A [B, Tl, NH, hs]; lse: the core's statistics
//   Y = X + A·W_Oᵀ                              local, no reduction (every head is here)
// Backward: dA = dY·W_O, dW_O = dYᵀA; Q, K, V recomputed from the kept N (the baselines' rule:
// keep N, not Q/K/V); dQ, dK, dV = core.backward; RoPE backward; dN and dW_Q/K/V; norm backward;
// residual. Weight and norm gradients are this rank's tokens' share: one all_reduce_buffers of
// {packed gradient, norm gradient} over the n ranks (rank order: bitwise reproducible; skipped
// when n = 1), so every rank ends with the full, identical gradient.
// Sub-groups: the group form runs on any Comm whose members share the sequence's tokens (the
// world for SP, Ulysses, ring and USP; an `sp` axis of a DP × SP mesh), holding the Tl tokens at
// the global positions the caller names; the gradients are reduced over that group only (a
// data-parallel axis outside it reduces them again). The Rank& form is the world's, on the
// shape's zigzag rows.
// Requirements: group.size() (rank.size()) == shape.Sp, shape.T == 1, !shape.sequence_parallel, a
// validated shape, and a core whose functions are set (std::invalid_argument naming the values
// otherwise). Buffers (this rank's Arena): weights — the packed layer attention weights
// (packed_shards.hpp, one shard of degree 1) and the norm weight; kept for backward (activations) —
// N [M, C], rstd [M], A [M, NH·hs], lse [B·NH·Tl] (handed to the core in backward as it left it);
// transient (workspace) — Q, K/V [2, M, NKV·hs] and their gradients, dA, dN; other — positions
// [Tl]. The core allocates its own buffers (see its header). Gradients (gradients) are allocated at
// the first backward and overwritten by each. Memory phases: "attention" (forward),
// "attention.backward". Cost: the reference block's GEMMs on M rows, the core, and in backward one
// all-reduce of the layer's attention parameters + C.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"
#include "tspemu/tsp/parameter_shard.hpp"

namespace tspemu::tsp {

class SequenceShardedAttention {
 public:
  // Copies the full attention weights and the norm weight from the master layer. Not collective.
  SequenceShardedAttention(Rank& rank, const BaselineShape& shape,
                           const ref::LayerWeights<float>& master, ref::AttentionCore<float> core);
  // On `group` (size shape.Sp), this rank's Tl tokens at the global `positions`, buffers in
  // `arena`: std::invalid_argument unless positions.size() == shape.Tl().
  SequenceShardedAttention(Comm& group, Arena& arena, const BaselineShape& shape,
                           std::span<const std::int64_t> positions,
                           const ref::LayerWeights<float>& master, ref::AttentionCore<float> core);

  void forward(const float* x, float* y);  // [B, Tl, C] in this rank's local token order
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
  void project(float* q, float* k, float* v);  // from xn_, RoPE applied to q and k

  Comm& comm_;  // the group the gradients are reduced over
  Arena& arena_;
  BaselineShape s_;
  TspShape shard_;  // degree 1: the packing of the full weights
  ref::AttentionCore<float> core_;
  Buffer<std::int64_t> positions_;  // [Tl] global positions of the local tokens (other)
  Buffer<float> w_;                 // packed wq, wk, wv, wo (weights)
  Buffer<float> norm_w_;            // [C] (weights)
  Buffer<float> grad_;              // packed (gradients)
  Buffer<float> grad_norm_;         // [C] (gradients)
  Buffer<float> xn_;                // [M, C] (activations)
  Buffer<float> rstd_;              // [M] (activations)
  Buffer<float> att_;               // [M, NH·hs] (activations)
  Buffer<float> lse_;               // [B·NH·Tl] (activations), the core's layout
};

}  // namespace tspemu::tsp
