#include "tspemu/check/replicated_weights.hpp"

#include <span>
#include <utility>
#include <vector>

#include "tspemu/reference/layer_tensors.hpp"
#include "tspemu/runtime/reduce_buffers.hpp"

namespace tspemu::check {

void attention_with_replicated_weights(RankBlock& rb, const ref::AttentionCore<float>& core,
                                       bool reduce_gradients) {
  attention_with_replicated_weights(rb, core, rb.comm(), reduce_gradients);
}

void attention_with_replicated_weights(RankBlock& rb, const ref::AttentionCore<float>& core,
                                       Comm& reduce_over, bool reduce_gradients) {
  const ref::ModelConfig& m = rb.config();
  auto grads = ref::LayerWeights<float>::zeros(m);
  ref::AttentionCache<float> cache;
  ref::attention_block_forward(m, rb.master(), rb.x().data(), rb.y().data(), rb.positions().data(),
                               rb.batches(), rb.tokens(), cache, core);
  ref::attention_block_backward(m, rb.master(), rb.x().data(), rb.dy().data(), rb.dx().data(),
                                rb.positions().data(), rb.batches(), rb.tokens(), cache, grads,
                                core);
  // The attention block's tensors (the table's rows of that block).
  std::vector<std::pair<const char*, std::vector<float>*>> named;
  for (std::size_t i = 0; const auto& entry : grads.named())
    if (ref::kLayerTensors[i++].block == ref::LayerBlock::attention) named.push_back(entry);
  std::vector<std::span<float>> buffers;
  buffers.reserve(named.size());
  for (const auto& [name, g] : named) buffers.emplace_back(*g);
  if (reduce_gradients) all_reduce_buffers<float>(reduce_over, buffers);
  for (const auto& [name, g] : named) rb.gradient(name, *g, replicated());
}

}  // namespace tspemu::check
