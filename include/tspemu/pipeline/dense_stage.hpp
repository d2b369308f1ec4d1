// DenseStage: a pipeline stage (stage.hpp) computed by the dense reference on one rank — the
// reference's embedding, layer forward/backward, final norm, LM head and cross-entropy
// (reference/model.hpp), unchanged, on the stage's layers.
//
// What: forward copies the stage's input x [B_mb, T, C] (stage 0: the embedded tokens) into a
//   buffer of the rank's arena under Category::activations, held until the microbatch's
//   backward_weight — one [B_mb, T, C] activation per microbatch in flight, so a schedule's peak
//   activation memory is (microbatches in flight) · round_up(B_mb·T·C·sizeof(T), 64) bytes, to the
//   byte — and runs its layers. backward_input recomputes the stage's forward from that input
//   (full recomputation at stage granularity, Megatron's "full" recompute; the layer caches are
//   transient heap memory, not arena), then runs the reference backward into zeroed per-microbatch
//   gradients: on the last stage dlogits = loss_scale · cross_entropy_backward, the head gradient
//   dlogitsᵀ·xn, the final norm's; then the layers in reverse; on stage 0 the embedding rows
//   scatter-added. backward_weight adds those into the accumulated gradients.
//   Gradient names: "embed" (stage 0), "layers.<l>.<field>" (kLayerTensors order), "final_norm"
//   and "lm_head" (the last stage; with tied embeddings "lm_head" is the head's part of the
//   embedding's gradient, which the executor sums with stage 0's "embed").
// Requirements: weights and arena outlive the stage; microbatches of micro_batch × seq tokens.
// Guarantees: the same calls give the same bits; a microbatch's gradient does not depend on the
//   stage cut (the layer backward sees the same dy whatever stage holds it), so any cut of the
//   same model gives bitwise the same gradients for the same accumulation order.
// Cost: forward = the stage's reference forward; backward_input = forward again + backward;
//   backward_weight = one pass over the stage's parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "tspemu/pipeline/stage.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/arena.hpp"

namespace tspemu::pipeline {

template <class T>
class DenseStage final : public Stage<T> {
 public:
  DenseStage(const ref::ModelWeights<T>& weights, StageSpan span, int micro_batch, int seq,
             Arena& arena);

  const StageSpan& span() const override { return span_; }
  std::size_t activation_elements() const override;
  double forward(int microbatch, const ref::Batch& mb, std::span<const T> x,
                 std::span<T> y) override;
  void backward_input(int microbatch, const ref::Batch& mb, std::span<const T> dy, std::span<T> dx,
                      double loss_scale) override;
  void backward_weight(int microbatch) override;
  std::vector<GradTensor<T>> gradients() override;
  std::vector<T>* tied_part(bool head) override;

  // Writes the stage's accumulated gradients into their places in `grads` (shaped as
  // ModelWeights::zeros); with tied embeddings the last stage writes its head part to embed.
  void export_gradients(ref::ModelWeights<T>& grads) const;

 private:
  struct Grads {
    std::vector<T> embed;
    std::vector<ref::LayerWeights<T>> layers;
    std::vector<T> final_norm, head;
  };
  struct Recompute;
  Grads zero_grads() const;
  void run_layers(const T* x0, Recompute& r) const;
  void head_backward(const ref::Batch& mb, Recompute& r, Grads& g, double loss_scale,
                     std::vector<T>& dh) const;
  static std::vector<GradTensor<T>> named(Grads& g, const StageSpan& s);

  const ref::ModelWeights<T>& w_;
  StageSpan span_;
  int B_, T_;
  Arena& arena_;
  std::vector<std::int64_t> positions_;
  std::map<int, Buffer<T>> saved_;  // microbatch -> the stage's input [B_mb, T, C]
  std::map<int, Grads> pending_;    // microbatch -> its weight gradients (after backward_input)
  Grads acc_;
};

}  // namespace tspemu::pipeline
