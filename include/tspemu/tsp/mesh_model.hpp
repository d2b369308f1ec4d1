// MeshModel: one rank's whole model under a mesh strategy — TP (Megatron), TP + Megatron-SP, SP
// (context parallel: also Ulysses and ring attention, whose layers differ only in the attention
// core) and TP+SP — embedding, L layers of the strategy's blocks (RankLayer), final RMSNorm, LM
// head and mean cross-entropy, forward and backward, on the T × Sp mesh of baseline_shape.hpp.
//
// Embedding and LM head, as the real implementations place them:
//   over the TP group (a row, T > 1): vocabulary-parallel. Column col owns rows
//     [col·V/T, (col+1)·V/T) of the embedding and of the LM head (Megatron-LM
//     core/tensor_parallel/layers.py, VocabParallelEmbedding and the ColumnParallelLinear
//     output layer; tied embeddings share the one shard, Megatron's
//     share_embeddings_and_output_weights).
//     embedding  each rank looks up the row's tokens whose ids it owns, zeros elsewhere, then
//                all_reduce(tp) (TP: reduce_from_tensor_model_parallel_region) or reduce_scatter
//                to the sequence pieces (Megatron-SP: reduce_scatter_to_sequence_parallel_region).
//                Backward: dx as is (TP) or all_gather'd from the pieces (Megatron-SP).
//     LM head    logits of the row's tokens for the V/T owned ids; Megatron-SP first all_gathers
//                the normed pieces (the output layer's sequence-parallel input) and gathers them
//                again in backward rather than keeping them (as Megatron's linear layer does).
//     loss       vocab_parallel_cross_entropy (Megatron-LM core/tensor_parallel/cross_entropy.py):
//                the per-token maximum over the TP group, then the sum of exp(logit - max) and
//                the target logit (0 on ranks that do not own the target) all_reduce'd(tp).
//                The runtime's all_reduce sums only, so the maximum is an all_gather of each
//                rank's per-token maxima, reduced locally: the same value on every rank.
//                Backward: (softmax - onehot) / (B·S) from the kept softmax; the LM head input's
//                gradient all_reduce(tp) (TP) or reduce_scatter(tp) (Megatron-SP).
//   over the SP group (a column, Sp > 1): replicated, each rank its own tokens (context parallel
//     splits only the sequence: Megatron-LM's CP, DeepSpeed-Ulysses, ring attention); the loss
//     sum and the embedding and LM head gradients are all_reduce'd(sp) (Megatron reduces them
//     with the data-parallel gradients over the DP × CP group). Tied: the head's gradient is
//     added to the embedding's before the one all_reduce.
//   final norm   on the layer rows (Megatron-SP's pieces); its gradient reduced as the blocks'
//                norms (baseline_region.hpp): over every rank under Megatron-SP, else over sp.
// So SP, Ulysses and ring replicate the embedding and LM head (T = 1), TP and Megatron-SP shard
// them over all ranks, TP+SP over its T axis and replicates them over Σ. TSP-NOTES.md says
// nothing of the vocabulary; tsp_model.hpp is TSP's choice.
//
// Requirements: shape.validate_whole_model() (BaselineShape::validate() and T | V; the
// constructor throws std::invalid_argument naming the values); the layers built by the strategy
// table's make_layer on the same shape. Every rank passes the same [B, S] tokens.
// Guarantees: the loss is bitwise the same on every rank; gradients complete on every rank that
// holds the parameter (replicas bitwise equal); per-rank bytes per collective equal
// cost::mesh_vocab_traffic + L × the layer's (tests/tsp/mesh_model_test.cpp).
// Memory (arena): weights — embedding shard [V/T, C], LM head shard (untied), final norm [C];
// gradients the same; activations — the L+1 layer inputs [B·rows, C], the normed final rows,
// rstd, the softmax [B·S/Sp, V/T] kept for backward, the row's token and target ids.
// Cost per rank: the [B·S/Sp, C] × [C, V/T] head GEMM forward and two backward; collectives as
// cost_model.hpp's VocabTraffic.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"
#include "tspemu/tsp/strategy.hpp"

namespace tspemu::tsp {

namespace detail {
class MeshRegion;
}

class MeshModel final : public RankModel {
 public:
  // layers: this rank's L layers, built on `shape` (strategy table's make_layer).
  MeshModel(Rank& rank, const BaselineShape& shape, std::vector<std::unique_ptr<RankLayer>> layers,
            const ref::ModelWeights<float>& master);
  ~MeshModel() override;

  double forward(std::span<const std::int32_t> tokens,
                 std::span<const std::int32_t> targets) override;
  void backward() override;
  void write_gradients(ref::ModelWeights<float>& full) const override;
  void write_weights(ref::ModelWeights<float>& full) const override;
  std::vector<ParameterShard> parameters() override;

 private:
  float* head() { return s_.model.tie_embeddings ? embed_.data() : head_.data(); }
  void write_tensors(ref::ModelWeights<float>& full, bool weights) const;
  bool pieces() const { return s_.sequence_parallel && s_.T > 1; }
  // The row's [B·Tl, C] of `local` (this rank's layer rows): itself, or under Megatron-SP the
  // pieces all-gathered into `storage` (workspace).
  const float* row_of(const float* local, Buffer<float>& storage);

  Rank& rank_;
  BaselineShape s_;
  std::unique_ptr<detail::MeshRegion> region_;  // the tp and sp groups, Megatron-SP's pieces
  int vocab_rows_, first_id_;
  std::vector<std::unique_ptr<RankLayer>> layers_;
  Buffer<float> embed_, head_, final_norm_;  // [V/T, C], [V/T, C] (untied), [C] (weights)
  Buffer<float> grad_embed_, grad_head_, grad_final_norm_;
  Buffer<std::int32_t> tokens_, targets_;  // the row's [B·Tl] (activations)
  std::vector<Buffer<float>> x_;           // L+1 × [B·rows, C]: x_[l] enters layer l
  Buffer<float> xn_, rstd_;                // [B·rows, C], [B·rows]: the final norm's
  Buffer<float> probs_;                    // [B·Tl, V/T]: softmax of the owned logits
};

}  // namespace tspemu::tsp
