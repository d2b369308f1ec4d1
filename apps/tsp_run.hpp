// `tspemu run`: one TSP training step (forward + backward) of a whole model on D ranks, checked
// against the dense reference (fp32) and the fp64 oracle, with a report of memory per rank by
// category, bytes moved per collective, time and tokens/s, and the error verdict.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::app {

struct RunOptions {
  tsp::TspShape shape;
  std::uint64_t seed = 1;
  double k = 3.0;  // the oracle rule's factor (tests/tsp states why 3)
  std::string json_path;
  RunOptions();  // the built-in default: 2 layers, D = 4, 2048 tokens
};

// Returns 0 when every tensor passes the oracle rule, 1 otherwise.
int run_tsp_step(const RunOptions& opts, std::ostream& out);

}  // namespace tspemu::app
