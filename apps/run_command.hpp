// `tspemu run`: one strategy's training step checked against the reference, with the full report
// (stack_report.hpp). Every strategy runs the whole model (embedding to loss, model_run.hpp)
// unless --layers-only asks for the layer stack (layer_stack.hpp).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include "checkpoint_options.hpp"
#include "problem_options.hpp"

namespace tspemu::app {

struct RunArgs {
  ProblemOptions problem;
  CheckpointArgs checkpoint;  // --weights, --save, --save-shard-size
  bool layers_only = false;
  bool no_check = false;
  bool quiet = false;
  std::string json_path;
  // Debugging (issue: traces, simulated clock, injection).
  std::string trace_path;
  SimClockArgs sim_clock;  // --sim-clock and its overrides: adds the simulated step
  std::optional<std::uint64_t> inject_seed;
  int inject_delay_us = 200;
  double inject_probability = 0.25;
  int inject_failure_rank = -1;
};

CLI::App* add_run_command(CLI::App& app, RunArgs& a);
// 0: PASS; 1: FAIL. Throws ConfigError for a bad configuration.
int run_command(const RunArgs& a, std::ostream& out);

}  // namespace tspemu::app
