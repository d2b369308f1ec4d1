// Optimizer: one update of a parameter tensor from its gradient — AdamW or plain SGD — and the
// reference's whole-model optimizer built on it.
//
// What: the element-wise update rules, written once and called by every implementation (the
//   reference in float and double, each parallel rank on its own shards), so an element's new
//   value depends only on its weight, gradient and state — never on how the tensor is sharded.
//   Given bitwise-equal gradients, a sharded update is bitwise equal to the reference's.
//   AdamW follows torch.optim.AdamW (decoupled weight decay, bias-corrected moments):
//     w *= 1 - lr·wd                                  (only tensors with decay)
//     m  = β1·m + (1-β1)·g ;  v = β2·v + (1-β2)·g²
//     w -= (lr / (1-β1^t)) · m / (sqrt(v) / sqrt(1-β2^t) + eps)
//   SGD (no momentum, no state): w *= 1 - lr·wd (decay only);  w -= lr·g.
//   Decay applies to matrices (projections, embedding, LM head), not to norm weights — the
//   usual Llama recipe; the caller says which (`decay`).
// Requirements: w, g, m, v of equal length; step t >= 1 (the number of updates so far, this one
//   included); OptimizerConfig::validate().
// Guarantees: deterministic; no allocation (Optimizer allocates its state once per tensor).
// State: AdamW 2 elements per parameter of T (fp32 state for T = float: 8 B/param); SGD none.
// Cost: a few flops per element, one pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tspemu/reference/model.hpp"

namespace tspemu::ref {

enum class OptimizerKind { sgd, adamw };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;

  // Throws std::invalid_argument naming the field and its value (lr <= 0, betas outside [0, 1),
  // eps <= 0, weight_decay < 0, non-finite values).
  void validate() const;
  // State elements per parameter: 2 (AdamW: m, v), 0 (SGD).
  int state_per_param() const { return kind == OptimizerKind::adamw ? 2 : 0; }
  std::string to_string() const;  // "adamw lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 wd=0"
};

// "adamw" or "sgd"; std::invalid_argument naming the known kinds otherwise.
OptimizerKind optimizer_kind_named(const std::string& name);
const char* optimizer_kind_name(OptimizerKind k);

template <class T>
void adamw_update(std::span<T> w, std::span<const T> g, std::span<T> m, std::span<T> v,
                  const OptimizerConfig& c, bool decay, std::int64_t step);
template <class T>
void sgd_update(std::span<T> w, std::span<const T> g, const OptimizerConfig& c, bool decay);

// The reference's optimizer: state per tensor, indexed by the tensor's place in the update order
// (the caller keeps the order fixed across steps; the whole-model step uses checkpoint order).
template <class T>
class Optimizer {
 public:
  explicit Optimizer(const OptimizerConfig& c);  // validates c

  // Starts update t + 1; the updates that follow use it.
  void begin_step() { ++step_; }
  // Updates tensor number `index` (state allocated, zeroed, on its first update).
  void update(std::size_t index, std::span<T> w, std::span<const T> g, bool decay);
  // begin_step, then every parameter in checkpoint order (parameters()), decay for matrices.
  void step(ModelWeights<T>& w, const ModelWeights<T>& grads);
  // begin_step, then each layer's nine tensors (LayerWeights::named order), decay for matrices.
  void step(std::vector<LayerWeights<T>>& w, const std::vector<LayerWeights<T>>& grads);

  std::int64_t steps() const { return step_; }
  const OptimizerConfig& config() const { return c_; }

 private:
  OptimizerConfig c_;
  std::int64_t step_ = 0;
  std::vector<std::vector<T>> m_, v_;
};

}  // namespace tspemu::ref
