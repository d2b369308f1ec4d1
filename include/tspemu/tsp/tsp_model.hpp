// TspModel: one rank's part of a whole TSP transformer — embedding, L TSP layers, final norm,
// LM head and the mean cross-entropy — forward and backward.
//
// Vocabulary sharding (a choice of ours; the paper does not say): rank r owns rows
// [r·V/D, (r+1)·V/D) of the embedding and of the LM head, and both are used the TSP way —
// broadcast one owner at a time, never all-reduced:
//   embedding  for each shard r: broadcast it; each rank copies the rows of its own tokens whose
//              ids fall in shard r.
//   LM head    for each shard r: broadcast it; each rank computes the logits of its own tokens for
//              those V/D ids and folds them into a running (online) logsumexp and the target logit,
//              so the full [tokens, V] logits never exist and no collective over the vocabulary is
//              needed. The loss is the all-reduce of one double per rank.
// Backward re-broadcasts each head shard, recomputes its logits, and reduces the partial weight
// gradients to the owner (as the attention shards). With tied embeddings the owner adds the head
// and embedding gradients of its shard. Norm weights are replicated; their gradients are
// all-reduced.
// Scalar type: T = float is TspModel, what every command runs; T = double (with the blocks
// BasicTspAttention<double>, BasicTspMlp<double> and the same collectives on doubles) runs the
// same schedule in fp64, so it can be compared with the fp64 oracle to ~1e-12 relative — a far
// sharper check than the fp32 rule (tests/tsp/tsp_model_double_test.cpp).
// Requirements: TspShape::validate() and D | V.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/parameter_shard.hpp"
#include "tspemu/tsp/tsp_layer.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {

template <class T>
class BasicTspModel {
 public:
  BasicTspModel(Rank& rank, const TspShape& shape, const ref::ModelWeights<T>& master);

  // tokens, targets: this rank's [B, Tl] (SequenceLayout::scatter of the full [B, S]). Returns
  // the mean cross-entropy over all B·S tokens, identical on every rank.
  double forward(const std::int32_t* tokens, const std::int32_t* targets);
  // Gradients of that loss for every parameter this rank owns (overwritten).
  void backward();

  // Writes the gradients this rank owns into their places in full-size tensors (rank 0 also
  // writes the replicated norm gradients). Ranks write disjoint elements, so all ranks may fill
  // the same `full` concurrently.
  void write_gradients(ref::ModelWeights<T>& full) const;
  // The same for the weights this rank holds (after optimizer updates): shards, and on rank 0
  // the replicated norms.
  void write_weights(ref::ModelWeights<T>& full) const;

  // Every parameter this rank holds, for the optimizer (sharded_optimizer.hpp): the embedding
  // shard, the LM head shard (untied), each layer's four (TspLayer::parameters), the final norm.
  // Valid after the first backward, which allocates the gradients.
  std::vector<BasicParameterShard<T>> parameters();

  int vocab_shard_rows() const { return vocab_rows_; }
  const Buffer<T>& grad_embed_shard() const { return grad_embed_; }  // [V/D, C]
  const Buffer<T>& grad_head_shard() const { return grad_head_; }    // [V/D, C]; empty if tied
  const Buffer<T>& grad_final_norm() const { return grad_final_norm_; }
  const BasicTspAttention<T>& attention(int layer) const {
    return layers_[static_cast<std::size_t>(layer)]->attention();
  }
  const BasicTspMlp<T>& mlp(int layer) const {
    return layers_[static_cast<std::size_t>(layer)]->mlp();
  }

 private:
  T* head_shard() { return s_.model.tie_embeddings ? embed_.data() : head_.data(); }
  // Writes the weights (weights = true) or the gradients of this rank's tensors into full.
  void write_tensors(ref::ModelWeights<T>& full, bool weights) const;

  Rank& rank_;
  TspShape s_;
  int vocab_rows_;
  std::vector<std::unique_ptr<BasicTspLayer<T>>> layers_;
  Buffer<T> embed_;       // [V/D, C] (weights)
  Buffer<T> head_;        // [V/D, C] (weights), empty when tied
  Buffer<T> final_norm_;  // [C]
  Buffer<T> grad_embed_, grad_head_, grad_final_norm_;
  Buffer<std::int32_t> tokens_, targets_;  // this rank's [B·Tl], from forward (activations)
  std::vector<Buffer<T>> x_;               // L+1 × [B·Tl, C]: x_[l] enters layer l
  Buffer<T> xn_final_, rstd_final_, lse_;  // [B·Tl, C], [B·Tl], [B·Tl]
};

using TspModel = BasicTspModel<float>;
extern template class BasicTspModel<float>;
extern template class BasicTspModel<double>;

}  // namespace tspemu::tsp
