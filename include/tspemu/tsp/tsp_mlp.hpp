// TspMlp: one rank's part of a TSP gated-MLP block, y = x + down(silu(gate(n)) * up(n)),
// n = rmsnorm(x).
//
// Schedule (paper: "weight shards circulate in a ring while partial outputs accumulate locally";
// the ring order is derived, TSP-NOTES.md). Rank p holds its tokens and MLP shard p (gate and up
// rows, down columns, packed). D compute steps, D-1 ring hops, double buffered:
//   Y_p = X_p;  cur = shard p
//   for k in 0..D-1:
//     if k < D-1: isend(cur -> p+1), irecv(next <- p-1)       started before the GEMMs
//     o = (p - k) mod D:  Y_p += (silu(N_p·W_gate^(o)ᵀ) ⊙ (N_p·W_up^(o)ᵀ)) · W_down^(o)ᵀ
//     wait for both; cur = next
// Backward runs the ring again: the weight shard hops ahead, and the gradient shard of o travels
// behind it, each rank adding its tokens' contribution; after D hops it arrives complete at its
// owner (summed in ring order o, o+1, ..., o-1). The norm weight's gradient is all-reduced.
// Kept for backward (activations): N_p, rstd, and gate/up pre-activations of every shard —
// [B·Tl, F] each, this rank's tokens only. Transient: two ring buffers (comm) of one shard each.
// Memory phases: "mlp", "mlp.backward".
// Scalar type: T = float (TspMlp) or double (the same schedule in fp64; see tsp_model.hpp).
#pragma once

#include <array>
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/storage_rounding.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/parameter_shard.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {

template <class T>
class BasicTspMlp {
 public:
  BasicTspMlp(Rank& rank, const TspShape& shape, const ref::LayerWeights<T>& master);
  // The same on a sub-group of D ranks (this rank holds shard comm.rank()); `comm` must outlive
  // the block.
  BasicTspMlp(Rank& rank, Comm& comm, const TspShape& shape, const ref::LayerWeights<T>& master);

  void forward(const T* x, T* y);  // [B, Tl, C]
  void backward(const T* x, const T* dy, T* dx);
  // The precision policy's storage rounding (reference/storage_rounding.hpp): with bf16 the block
  // rounds its stored tensors at the reference's points (listed there), every accumulation across
  // shards and ranks staying fp32, so it differs from the bf16 reference by summation order only.
  // The caller passes bf16 weights and inputs. Default fp32: nothing rounded. T = double ignores
  // it.
  void set_storage(ref::StorageRounding storage) { storage_ = storage; }

  const Buffer<T>& grad_shard() const { return grad_; }
  const Buffer<T>& grad_norm() const { return grad_norm_; }
  const Buffer<T>& weight_shard() const { return w_; }
  const Buffer<T>& norm_weight() const { return norm_w_; }  // [C], replicated
  // The weight shard ("mlp") and the replicated norm weight ("post_norm"), with their
  // gradients, for the optimizer (sharded_optimizer.hpp).
  std::array<BasicParameterShard<T>, 2> parameters() {
    return {{{"mlp", w_.span(), grad_.span(), false, true},
             {"post_norm", norm_w_.span(), grad_norm_.span(), true, false}}};
  }
  // Elements of one [B, Tl, C] activation of this rank.
  std::size_t local_elements() const {
    return static_cast<std::size_t>(s_.B) * s_.Tl() * s_.model.hidden;
  }

 private:
  Rank& rank_;
  Comm& comm_;  // the D ranks of the TSP group
  TspShape s_;
  Buffer<T> w_;          // packed MLP shard p (weights)
  Buffer<T> norm_w_;     // [C] (weights, replicated)
  Buffer<T> grad_;       // packed gradient of shard p
  Buffer<T> grad_norm_;  // [C]
  Buffer<T> xn_;         // [B·Tl, C]
  Buffer<T> rstd_;       // [B·Tl]
  Buffer<T> gate_up_;    // [D][B·Tl, 2·Fl] by shard index o: gate | up per row
  ref::StorageRounding storage_{};
  void store(T* p, std::size_t n) const;  // storage_.store, not on a dry run's unbacked buffers
};

using TspMlp = BasicTspMlp<float>;
extern template class BasicTspMlp<float>;
extern template class BasicTspMlp<double>;

}  // namespace tspemu::tsp
