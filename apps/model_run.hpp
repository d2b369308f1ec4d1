// One training step (forward + backward) of a whole model — embedding, L layers, final norm, LM
// head, loss — under any strategy of the strategy table (its make_model: TSP's TspModel, the
// mesh strategies' MeshModel), checked against the dense reference (fp32) and the fp64 oracle:
// the loss and every parameter gradient. Traffic is checked against L × the cost model's layer
// plus its embedding/LM head/loss part (cost::vocab_traffic), exactly; weights and gradients in
// the arena against L × the dry layer plus the vocabulary shards and the final norm.
#pragma once

#include "layer_stack.hpp"

namespace tspemu::app {

// c.model.vocab divisible by the strategy's vocabulary shards (cost::vocab_shards). c.check is
// honoured.
StackResult run_model(const StackConfig& c);

}  // namespace tspemu::app
