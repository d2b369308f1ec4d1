// The flags `run`, `compare` and `scale` share: the model, the problem size and the strategy, with
// the built-in default (a 2-layer model, h = 256, 8 query / 4 KV heads, 2048 tokens, TSP D = 4),
// and the checks that name the offending flag (ConfigError, exit code 2) before any thread starts.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <stdexcept>
#include <string>

#include "layer_stack.hpp"

namespace tspemu::app {

// A configuration the user must change; the message names the flag and the constraint.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct ProblemOptions {
  ref::ModelConfig model;
  int B = 1;
  int S = 2048;
  std::string strategy = "tsp";
  int ranks = 4;  // D of TSP, the degree of the 1-D schemes
  int tp = 2;     // T of tp-sp
  int sp = 2;     // Sp of tp-sp
  std::string layout = "zigzag";
  int head_buckets = 1;
  std::uint64_t seed = 1;
  bool pin = false;
  ProblemOptions();
};

// Model and size flags (--layers --hidden --heads --kv-heads --ffn --vocab --tied --batch --seq
// --seed --layout --head-buckets --pin).
void add_problem_options(CLI::App& app, ProblemOptions& o);
// --strategy (the strategy table's names), --ranks/-D, --tp, --sp.
void add_strategy_options(CLI::App& app, ProblemOptions& o);

// --sim-clock NAME: nullopt for "", the preset for "nvlink" or "network", ConfigError otherwise.
std::optional<SimClockModel> sim_clock_option(const std::string& name);

// The strategy table's entry named o.strategy (strategy.hpp) with the degrees of o: --ranks, or
// --tp × --sp for a grid (ConfigError listing the known names otherwise).
tsp::cost::Strategy parse_strategy(const ProblemOptions& o);

// The stack configuration of o for strategy st (degree flags as given by `degree_flags`, e.g.
// "--ranks 3"), checked: throws ConfigError naming the flag and the constraint. `whole_model`
// adds TSP's vocabulary requirement.
StackConfig make_stack_config(const ProblemOptions& o, const tsp::cost::Strategy& st,
                              bool whole_model = false);

// The same checks without building anything: the reason st cannot run o, or "" when it can.
std::string why_invalid(const ProblemOptions& o, const tsp::cost::Strategy& st,
                        bool whole_model = false);

}  // namespace tspemu::app
