// BaselineMlp: one rank's part of the gated-MLP block y = x + down(silu(gate(n)) * up(n)),
// n = norm(x), under TP (Megatron), TP + Megatron-SP, SP (context parallel) or TP+SP — the
// T × Sp mesh of baseline_shape.hpp. Rank (row, col) holds MLP shard col (gate/up rows:
// column-parallel; down columns: row-parallel; packed_shards.hpp) and the tokens of row's
// sequence shard (replicated over the row; with Megatron-SP only its contiguous piece).
//
// Forward:
//   N = norm(X)  [B, Tl, C]           TP: on the replicated tokens; Megatron-SP: on the piece,
//                                     then all_gather(tp) of the normed pieces
//   G, U = N·W_gateᵀ, N·W_upᵀ  [B·Tl, Fl]
//   Y = X + Σ_row (silu(G) ⊙ U)·W_downᵀ   all_reduce(tp); Megatron-SP: reduce_scatter(tp)
// Tokens are independent in the MLP: the SP axis moves nothing in forward.
// Backward (the adjoint): dY all_gather(tp) under Megatron-SP; dH = dY·W_down, dW_down = dYᵀH;
// dG, dU through silu_mul; dW_gate = dGᵀN, dW_up = dUᵀN; dN = dG·W_gate + dU·W_up,
// all_reduce(tp) (Megatron-SP: reduce_scatter(tp)); norm backward; residual.
// Gradients: weight shard partial across rows → all_reduce(sp) if Sp > 1. Norm weight: bitwise
// equal across a row without Megatron-SP (same tokens, same reduced dN) — not all-reduced over
// tp, all-reduced over sp; with Megatron-SP all-reduced over every rank (rank order).
// Kept for backward (activations): N [B·Tl, C], rstd, G and U [B·Tl, Fl]. Under Megatron-SP N is
// kept gathered (as in BaselineAttention; Megatron-LM re-gathers the piece in backward instead).
// Transient: H and its gradients (workspace), the partial down_proj output and the pieces in
// flight (workspace/comm).
// Memory phases: "mlp", "mlp.backward".
#pragma once

#include <array>
#include <memory>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"
#include "tspemu/tsp/parameter_shard.hpp"

namespace tspemu::tsp {

namespace detail {
class MeshRegion;
}

class BaselineMlp {
 public:
  // Collective: splits the world into the row (tp) and column (sp) groups.
  BaselineMlp(Rank& rank, const BaselineShape& shape, const ref::LayerWeights<float>& master);
  ~BaselineMlp();

  void forward(const float* x, float* y);  // [B, rows(), C]
  void backward(const float* x, const float* dy, float* dx);

  const Buffer<float>& grad_shard() const { return grad_; }
  const Buffer<float>& grad_norm() const { return grad_norm_; }
  const Buffer<float>& weight_shard() const { return w_; }
  // The weight shard ("mlp") and the replicated norm weight ("post_norm"), with their
  // gradients, for the optimizer (sharded_optimizer.hpp).
  std::array<ParameterShard, 2> parameters() {
    return {{{"mlp", w_.span(), grad_.span(), false, true},
             {"post_norm", norm_w_.span(), grad_norm_.span(), true, false}}};
  }

 private:
  Rank& rank_;
  BaselineShape s_;
  TspShape shard_;
  std::unique_ptr<detail::MeshRegion> region_;
  Buffer<float> w_;          // packed MLP shard col (weights)
  Buffer<float> norm_w_;     // [C] (weights, replicated)
  Buffer<float> grad_;       // packed (gradients)
  Buffer<float> grad_norm_;  // [C] (gradients)
  Buffer<float> xn_;         // [B·Tl, C] (activations)
  Buffer<float> rstd_;       // [B·rows] (activations)
  Buffer<float> gate_;       // [B·Tl, Fl] (activations)
  Buffer<float> up_;         // [B·Tl, Fl] (activations)
};

}  // namespace tspemu::tsp
