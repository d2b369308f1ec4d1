#include "tspemu/tsp/sharded_optimizer.hpp"

#include <stdexcept>
#include <string>
#include <utility>

namespace tspemu::tsp {

ShardedOptimizer::ShardedOptimizer(Rank& rank, const ref::OptimizerConfig& config,
                                   std::vector<ParameterShard> shards)
    : c_(config), shards_(std::move(shards)) {
  c_.validate();
  for (const ParameterShard& p : shards_)
    if (p.grad.size() != p.weight.size())
      throw std::invalid_argument(
          "rank " + std::to_string(rank.id()) + ": ShardedOptimizer: " + p.name + " has " +
          std::to_string(p.weight.size()) + " weights but " + std::to_string(p.grad.size()) +
          " gradients (build the optimizer after the first backward, "
          "which allocates the gradients)");
  if (c_.kind != ref::OptimizerKind::adamw) return;
  for (const ParameterShard& p : shards_) {
    m_.push_back(rank.arena().allocate<float>(p.weight.size(), Category::optimizer, true));
    v_.push_back(rank.arena().allocate<float>(p.weight.size(), Category::optimizer, true));
  }
}

void ShardedOptimizer::step() {
  ++step_;
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    const ParameterShard& p = shards_[i];
    if (c_.kind == ref::OptimizerKind::adamw)
      ref::adamw_update<float>(p.weight, p.grad, m_[i].span(), v_[i].span(), c_, p.decay, step_);
    else
      ref::sgd_update<float>(p.weight, p.grad, c_, p.decay);
  }
}

}  // namespace tspemu::tsp
