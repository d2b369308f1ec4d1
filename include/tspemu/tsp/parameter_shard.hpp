// ParameterShard: one parameter tensor as a rank holds it — its weights and their gradient, both
// in the rank's arena — and how the optimizer treats it.
//
// Kinds: a shard (this rank's part of a sharded tensor: a packed attention or MLP shard, a
// vocabulary shard; possibly replicated over another mesh axis, e.g. the rows of TP+SP) or a
// replicated norm weight (every rank holds all of it, with the same gradient after the blocks'
// all-reduce, so every rank's update is bitwise the same and no collective is needed).
// Guarantees of the blocks that hand these out: weight and grad have equal length and stay valid
// while the block lives; grad holds the complete gradient of those elements after backward.
#pragma once

#include <span>

namespace tspemu::tsp {

template <class T>
struct BasicParameterShard {
  const char* name;  // "attention", "input_norm", "mlp", "post_norm", "embed", ...
  std::span<T> weight;
  std::span<const T> grad;
  bool replicated = false;  // a norm weight, whole on every rank
  bool decay = true;        // AdamW weight decay applies (matrices: yes; norms: no)
};

using ParameterShard = BasicParameterShard<float>;

}  // namespace tspemu::tsp
