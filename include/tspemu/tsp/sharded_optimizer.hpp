// ShardedOptimizer: one rank's optimizer — AdamW or SGD (reference/optimizer.hpp) over the
// parameters this rank holds, each rank updating its own shards.
//
// What: for every ParameterShard, the element-wise update of ref::adamw_update / sgd_update,
//   with the moments m and v (AdamW) allocated in the rank's arena under Category::optimizer,
//   fp32, the size of the shard: 8 B per parameter held (0 for SGD). No master copy, no
//   collective: a shard's gradient is complete on the rank after backward, and replicated
//   parameters (norm weights) have bitwise-equal gradients on every rank, so their updates stay
//   bitwise equal without communication.
// Requirements: the shards outlive the optimizer; their order and sizes are fixed; step() after
//   each backward, on every rank or none (nothing is collective, but the step count is shared).
// Guarantees: given the same gradients, every element ends bitwise equal to the reference
//   optimizer's update of that element (same function, same scalars).
// Cost: one pass over the rank's parameters; no traffic.
#pragma once

#include <cstdint>
#include <vector>

#include "tspemu/reference/optimizer.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/parameter_shard.hpp"

namespace tspemu::tsp {

class ShardedOptimizer {
 public:
  // Allocates the state (zeroed) for every shard.
  ShardedOptimizer(Rank& rank, const ref::OptimizerConfig& config,
                   std::vector<ParameterShard> shards);

  void step();  // one update of every shard
  std::int64_t steps() const { return step_; }
  const std::vector<ParameterShard>& shards() const { return shards_; }

 private:
  ref::OptimizerConfig c_;
  std::vector<ParameterShard> shards_;
  std::vector<Buffer<float>> m_, v_;  // per shard (optimizer); empty for SGD
  std::int64_t step_ = 0;
};

}  // namespace tspemu::tsp
