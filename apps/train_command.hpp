// `tspemu train`: N optimizer steps of one strategy and of the reference side by side on a
// corpus, every step checked against the fp64 oracle's trajectory (train_run.hpp), with a
// progress bar, the per-step table, model-state bytes per rank measured vs the planner, JSON and
// an SVG chart of both loss curves and of the per-step error ratio.
#pragma once

#include <iosfwd>
#include <string>

#include "checkpoint_options.hpp"
#include "problem_options.hpp"
#include "train_pipeline.hpp"
#include "tspemu/reference/optimizer.hpp"

namespace tspemu::app {

struct TrainArgs {
  ProblemOptions problem;
  CheckpointArgs checkpoint;  // --weights, --save, --save-shard-size
  int steps = 60;
  bool layers_only = false;
  std::string optimizer = "adamw";
  ref::OptimizerConfig opt{.lr = 3e-3};
  std::string data;  // "" = the built-in corpus
  bool quiet = false;
  std::string json_path, svg_path;
  PipelineTrainArgs pipeline;  // --pp > 0: the pipelined run (train_pipeline.hpp)
  TrainArgs();
};

CLI::App* add_train_command(CLI::App& app, TrainArgs& a);
// 0: every step within the rule and the model-state bytes as planned; 1 otherwise. Throws
// ConfigError / std::invalid_argument for a bad configuration before anything runs.
int train_command(const TrainArgs& a, std::ostream& out);

}  // namespace tspemu::app
