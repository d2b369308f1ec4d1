// Stage: what one pipeline stage computes, as the executor (executor.hpp) sees it — forward of a
// microbatch, its input-gradient pass, its weight-gradient pass — and how a model's layers and a
// batch are cut for a pipeline.
//
// What
//   stage_span(L, S, k): stage k of S holds layers [first_layer, end_layer), contiguous, the first
//   L mod S stages one layer more; stage 0 also holds the token embedding, stage S−1 the final
//   norm, the LM head and the loss.
//   cut_microbatches(batch, m): m microbatches of batch.B / m sequences each, views of the batch
//   (no copy), microbatch j = sequences [j·B/m, (j+1)·B/m).
//   Stage<T>: the interface a stage's compute implements. The executor hands it the boundary
//   activations of one microbatch as spans of activation_elements() elements (this rank's part:
//   the dense stage's [B_mb, T, C]; a stage running a sharded strategy on a sub-group would hold
//   its shard and keep its own Comm), so the executor never sees how a stage computes.
//     forward(j, mb, x, y)   x: the previous stage's output (empty on the first stage, which reads
//                            mb.tokens); y: overwritten with this stage's output (empty on the
//                            last stage). Returns the microbatch's mean loss on the last stage
//                            (0 elsewhere). The stage keeps what its backward needs for j.
//     backward_input(j, mb, dy, dx, loss_scale)
//                            dy: the gradient of this stage's output (empty on the last stage,
//                            whose output gradient is d(loss_scale · loss_j)); dx: overwritten
//                            with the gradient of x (empty on the first stage). Microbatch j's
//                            weight gradients are computed and kept pending.
//     backward_weight(j)     adds microbatch j's pending weight gradients into the stage's
//                            accumulated gradients (element-wise, acc += g_j) and frees what j
//                            held. A full backward B is backward_input then backward_weight.
//     gradients()            the accumulated gradient tensors, named, in a fixed order (the order
//                            every replica of the stage reduces them in).
//     tied_part(head)        with tied embeddings: the accumulated gradient of the embedding's use
//                            as the token embedding (head = false, the first stage) or as the LM
//                            head (head = true, the last stage); the executor sums the two. Null
//                            when untied or when the stage does not hold that use.
// Requirements: backward_input(j) after forward(j), backward_weight(j) after backward_input(j),
//   each once per microbatch and step; the spans sized as activation_elements().
// Guarantees (implementations): deterministic — the same calls in the same order give the same
//   bits; the accumulation order of the weight gradients is the order of the backward_weight calls.
// Cost: stage_span O(1); cut_microbatches O(m).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "tspemu/reference/model.hpp"

namespace tspemu::pipeline {

struct StageSpan {
  int stage = 0;
  int stages = 1;
  int first_layer = 0;
  int end_layer = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
};

// Throws std::invalid_argument naming the values unless 1 <= stages <= layers and 0 <= stage <
// stages.
StageSpan stage_span(int layers, int stages, int stage);

// Throws std::invalid_argument naming B and m unless m >= 1 divides batch.B.
std::vector<ref::Batch> cut_microbatches(const ref::Batch& batch, int microbatches);

template <class T>
struct GradTensor {
  std::string name;  // checkpoint-like: "embed", "layers.3.wq", "final_norm", "lm_head"
  std::vector<T>* data;
};

template <class T>
class Stage {
 public:
  Stage() = default;
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;
  virtual ~Stage() = default;

  virtual const StageSpan& span() const = 0;
  virtual std::size_t activation_elements() const = 0;
  virtual double forward(int microbatch, const ref::Batch& mb, std::span<const T> x,
                         std::span<T> y) = 0;
  virtual void backward_input(int microbatch, const ref::Batch& mb, std::span<const T> dy,
                              std::span<T> dx, double loss_scale) = 0;
  virtual void backward_weight(int microbatch) = 0;
  virtual std::vector<GradTensor<T>> gradients() = 0;
  virtual std::vector<T>* tied_part(bool head) = 0;
};

}  // namespace tspemu::pipeline
