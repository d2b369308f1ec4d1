// TspAttention: one rank's part of a TSP attention block, y = x + o_proj(attn(norm(x))).
//
// Schedule (TSP-NOTES.md; paper: "ranks iterate over broadcast parameter shards and reconstruct
// context through a sequence-wise key/value exchange"). Rank p holds its tokens X_p [B, Tl, C]
// and head shard p of W_Q, W_K, W_V, W_O packed in one buffer (packed_shards.hpp).
//   Y_p = X_p;  N_p = rmsnorm(X_p)
//   for r in 0..D-1:                                     (D broadcasts)
//     W = broadcast(packed shard r, root r)
//     for each head bucket: Q, K, V = N_p·W_Qᵀ, N_p·W_Kᵀ, N_p·W_Vᵀ; RoPE(Q, K) at global positions
//       K_all, V_all = all_gather(K, V), reordered by global position      (full sequence)
//       A = causal_attention(Q, K_all, V_all);  Y_p += A · W_Oᵀ          (no all-reduce)
// Backward (the adjoint): re-broadcast shard r; recompute Q, K, V and the gathered K/V;
// dA = dY·W_O; the partial dW of shard r from this rank's tokens is reduced to its owner r
// (reduce, rank order); dK, dV of the full sequence are reduce-scattered back to their token
// owners. The norm weight is replicated; its gradient is all-reduced.
// Kept for backward (Category::activations): N_p, rstd, A and the softmax statistics of every
// shard — [B, Tl, C] per tensor, i.e. 1/D of the sequence. Transient: the broadcast shard
// (Category::comm), the full-sequence K/V of one bucket (Category::kv), Q/K/V (workspace).
// Memory phases recorded in the arena: "attention" (forward), "attention.backward".
// Options (TspOptions): keep the broadcast shards and/or the gathered K/V from forward, so the
// backward neither re-broadcasts nor re-gathers; overlap (the default) posts every transfer one
// step ahead, on the rank's one communication stream in the order it is needed:
//   forward  shard r's K/V all-gather of bucket b+1 (iall_gather) before bucket b's attention;
//            shard r+1's broadcast (ibroadcast, into the other half of a two-shard buffer) right
//            after shard r's last all-gather, so it runs under shard r's last bucket;
//   backward the same, plus bucket b's dK/dV reduce-scatter (ireduce_scatter) under its dQ GEMMs
//            (dW_Q and dX's dQ term come before the dK/dV terms in both schedules), and shard r's
//            weight-gradient reduce (ireduce, from the other half of a two-shard partial-gradient
//            buffer) under shard r+1, waited at its end.
// With head buckets, bucket b+1's all-gather lands in the gathered buffer while bucket b's dK/dV
// leave, so backward sends them from one more buffer of that size (comm). A bucket's Q projection
// is computed while its all-gather runs. Results are bitwise the same under every option.
// Scalar type: T = float (TspAttention) or double (the same schedule in fp64; see tsp_model.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/reference/storage_rounding.hpp"
#include "tspemu/runtime/nonblocking.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/parameter_shard.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {

template <class T>
class BasicTspAttention {
 public:
  // Cuts this rank's shard (and the replicated norm weight) from the master layer.
  BasicTspAttention(Rank& rank, const TspShape& shape, const ref::LayerWeights<T>& master);
  // The same on a sub-group (e.g. the TSP row of a data-parallel x TSP mesh): `comm` has D ranks
  // and this rank holds shard comm.rank(); `comm` must outlive the block. The world form is this
  // with rank.comm().
  BasicTspAttention(Rank& rank, Comm& comm, const TspShape& shape,
                    const ref::LayerWeights<T>& master);

  void forward(const T* x, T* y);  // [B, Tl, C] this rank's tokens
  // x: forward's input; dy: gradient of y; dx overwritten. Gradients of this rank's shard and of
  // the norm weight are overwritten (see grad_shard, grad_norm).
  void backward(const T* x, const T* dy, T* dx);
  // The precision policy's storage rounding (reference/storage_rounding.hpp): with bf16 the block
  // rounds its stored tensors at the reference's points (listed there), every accumulation across
  // shards and ranks staying fp32, so it differs from the bf16 reference by summation order only.
  // The caller passes bf16 weights and inputs. Default fp32: nothing rounded. T = double ignores
  // it.
  void set_storage(ref::StorageRounding storage) { storage_ = storage; }

  const Buffer<T>& grad_shard() const { return grad_; }      // packed like the weights
  const Buffer<T>& grad_norm() const { return grad_norm_; }  // [C], summed over all ranks
  const Buffer<T>& weight_shard() const { return w_; }
  const Buffer<T>& norm_weight() const { return norm_w_; }  // [C], replicated
  // The weight shard ("attention") and the replicated norm weight ("input_norm"), with their
  // gradients, for the optimizer (sharded_optimizer.hpp).
  std::array<BasicParameterShard<T>, 2> parameters() {
    return {{{"attention", w_.span(), grad_.span(), false, true},
             {"input_norm", norm_w_.span(), grad_norm_.span(), true, false}}};
  }

 private:
  struct Scratch;
  void project_q(const T* W, int bucket, T* q);
  void project_kv(const T* W, int bucket, T* kv_local);
  CollectiveHandle start_kv_gather(const T* W, int bucket, T* kv_local, T* kv_gathered);
  void project_and_gather_kv(const T* W, int bucket, T* kv_local, T* kv_gathered, T* k_all,
                             T* v_all);
  T* kept_shard(int r);          // options.keep_attention_shards
  T* kept_k(int r, int bucket);  // options.keep_kv
  T* kept_v(int r, int bucket);
  void store(T* p, std::size_t n) const;  // storage_.store, not on a dry run's unbacked buffers

  Rank& rank_;
  Comm& comm_;  // the D ranks of the TSP group
  TspShape s_;
  SequenceLayout layout_;
  Buffer<std::int64_t> positions_;    // [Tl] global positions of this rank's tokens (other)
  Buffer<std::int64_t> k_positions_;  // [S] 0..S-1: gathered K/V is in global order (other)
  Buffer<T> w_;                       // packed shard (weights)
  Buffer<T> norm_w_;                  // [C] (weights, replicated)
  Buffer<T> grad_;                    // packed shard (gradients)
  Buffer<T> grad_norm_;               // [C] (gradients)
  Buffer<T> xn_;                      // [B·Tl, C] (activations)
  Buffer<T> rstd_;                    // [B·Tl]
  Buffer<T> att_;          // [D][buckets][B·Tl, NHb·hs] attention outputs (activations)
  Buffer<T> lse_;          // [D][buckets][B, NHb, Tl]
  Buffer<T> kept_shards_;  // [D][packed shard] (comm), only with keep_attention_shards
  Buffer<T> kept_kv_;      // [D][buckets][2][B, S, NKVb·hs] (kv), only with keep_kv
  ref::StorageRounding storage_{};
};

using TspAttention = BasicTspAttention<float>;
extern template class BasicTspAttention<float>;
extern template class BasicTspAttention<double>;

}  // namespace tspemu::tsp
