// `tspemu scale`: CPU scaling of one strategy's layer stack (forward + backward, no oracle):
// strong scaling (the --seq problem at D = 1, 2, 4, ... --max-ranks) and weak scaling (fixed
// tokens per rank, --seq / --max-ranks, so the largest point is the strong problem). Tokens/s is
// the median of --repeat runs; efficiency = (tokens/s at D / tokens/s at D = 1) / min(D, cores).
#pragma once

#include <iosfwd>
#include <string>

#include "problem_options.hpp"

namespace tspemu::app {

struct ScaleArgs {
  ProblemOptions problem;
  int max_ranks = 8;
  std::string mode = "both";
  int repeat = 3;
  bool quiet = false;
  std::string json_path, svg_path;
};

CLI::App* add_scale_command(CLI::App& app, ScaleArgs& a);
// 0 when every run's traffic matched the cost model; 1 otherwise.
int scale_command(const ScaleArgs& a, std::ostream& out);

}  // namespace tspemu::app
