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
#include <vector>

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

// A whole model's parameters in the one order every model (TspModel, MeshModel) hands them out,
// which a ShardedOptimizer's state follows: the embedding shard, the LM head shard (untied only),
// each layer's own parameters() in layer order, the final norm. Buf is the arena's Buffer<T>;
// layers hold pointers to blocks with parameters().
template <class T, class Buf, class Layers>
std::vector<BasicParameterShard<T>> model_parameters(Buf& embed, Buf& grad_embed, bool tied,
                                                     Buf& head, Buf& grad_head, Layers& layers,
                                                     Buf& final_norm, Buf& grad_final_norm) {
  std::vector<BasicParameterShard<T>> p{{"embed", embed.span(), grad_embed.span(), false, true}};
  if (!tied) p.push_back({"lm_head", head.span(), grad_head.span(), false, true});
  for (auto& layer : layers) {
    const auto lp = layer->parameters();
    p.insert(p.end(), lp.begin(), lp.end());
  }
  p.push_back({"final_norm", final_norm.span(), grad_final_norm.span(), true, false});
  return p;
}

}  // namespace tspemu::tsp
