// One TSP training step (forward + backward) of a whole model — embedding, L TSP layers, final
// norm, LM head, loss — on D ranks, checked against the dense reference (fp32) and the fp64
// oracle: the loss and every parameter gradient. Traffic is checked against L × the cost model's
// layer plus the vocabulary-sharded embedding and LM head (vocab_traffic), exactly.
#pragma once

#include "layer_stack.hpp"

namespace tspemu::app {

// Bytes rank r moves in TspModel's embedding, LM head and loss (tsp_model.cpp), forward and
// backward: per pass D broadcasts of each V/D × C shard (root rotating), the head's and the
// embedding's gradient reduces to their owners, the loss all-reduce (one double) and the final
// norm's gradient all-reduce (C floats).
struct VocabTraffic {
  tsp::cost::Traffic forward, backward;
};
VocabTraffic vocab_traffic(const ref::ModelConfig& m, int D, int rank);

// c.strategy must be TSP; c.model.vocab divisible by D. c.check is honoured.
StackResult run_tsp_model(const StackConfig& c);

}  // namespace tspemu::app
