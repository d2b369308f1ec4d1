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

class TspModel {
 public:
  TspModel(Rank& rank, const TspShape& shape, const ref::ModelWeights<float>& master);

  // tokens, targets: this rank's [B, Tl] (SequenceLayout::scatter of the full [B, S]). Returns
  // the mean cross-entropy over all B·S tokens, identical on every rank.
  double forward(const std::int32_t* tokens, const std::int32_t* targets);
  // Gradients of that loss for every parameter this rank owns (overwritten).
  void backward();

  // Writes the gradients this rank owns into their places in full-size tensors (rank 0 also
  // writes the replicated norm gradients). Ranks write disjoint elements, so all ranks may fill
  // the same `full` concurrently.
  void write_gradients(ref::ModelWeights<float>& full) const;
  // The same for the weights this rank holds (after optimizer updates): shards, and on rank 0
  // the replicated norms.
  void write_weights(ref::ModelWeights<float>& full) const;

  // Every parameter this rank holds, for the optimizer (sharded_optimizer.hpp): the embedding
  // shard, the LM head shard (untied), each layer's four (TspLayer::parameters), the final norm.
  // Valid after the first backward, which allocates the gradients.
  std::vector<ParameterShard> parameters();

  int vocab_shard_rows() const { return vocab_rows_; }
  const Buffer<float>& grad_embed_shard() const { return grad_embed_; }  // [V/D, C]
  const Buffer<float>& grad_head_shard() const { return grad_head_; }    // [V/D, C]; empty if tied
  const Buffer<float>& grad_final_norm() const { return grad_final_norm_; }
  const TspAttention& attention(int layer) const {
    return layers_[static_cast<std::size_t>(layer)]->attention();
  }
  const TspMlp& mlp(int layer) const { return layers_[static_cast<std::size_t>(layer)]->mlp(); }

 private:
  float* head_shard() { return s_.model.tie_embeddings ? embed_.data() : head_.data(); }
  // Writes the weights (weights = true) or the gradients of this rank's tensors into full.
  void write_tensors(ref::ModelWeights<float>& full, bool weights) const;

  Rank& rank_;
  TspShape s_;
  int vocab_rows_;
  std::vector<std::unique_ptr<TspLayer>> layers_;
  Buffer<float> embed_;       // [V/D, C] (weights)
  Buffer<float> head_;        // [V/D, C] (weights), empty when tied
  Buffer<float> final_norm_;  // [C]
  Buffer<float> grad_embed_, grad_head_, grad_final_norm_;
  Buffer<std::int32_t> tokens_, targets_;      // this rank's [B·Tl], from forward (activations)
  std::vector<Buffer<float>> x_;               // L+1 × [B·Tl, C]: x_[l] enters layer l
  Buffer<float> xn_final_, rstd_final_, lse_;  // [B·Tl, C], [B·Tl], [B·Tl]
};

}  // namespace tspemu::tsp
