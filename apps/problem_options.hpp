// The flags `run`, `compare` and `scale` share: the model, the problem size and the strategy, with
// the built-in default (a 2-layer model, h = 256, 8 query / 4 KV heads, 2048 tokens, TSP D = 4),
// and the checks that name the offending flag (ConfigError, exit code 2) before any thread starts.
#pragma once

#include "cli_fwd.hpp"

#include <optional>
#include <stdexcept>
#include <string>

#include "layer_stack.hpp"
#include "tspemu/core/precision.hpp"

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
  bool serial_attention = false;  // TSP: TspOptions::overlap off
  std::uint64_t seed = 1;
  bool pin = false;
  std::string precision = "fp32";  // --precision: fp32 or bf16
  std::string grad_reduce;         // --grad-reduce: fp32 or bf16; "" = the precision's default
  ProblemOptions();
};

// Model and size flags (--layers --hidden --heads --kv-heads --ffn --vocab --tied --batch --seq
// --seed --layout --head-buckets --serial-attention --pin) and --precision; once the command line
// is parsed, precision_policy(o) checks the precision flags (a ConfigError ends the parse).
void add_problem_options(CLI::App& app, ProblemOptions& o);
// --grad-reduce, for the commands that compute gradients (run, compare, scale, train).
void add_grad_reduce_option(CLI::App& app, ProblemOptions& o);

// The precision policy of --precision and --grad-reduce (core/precision.hpp): fp32, or
// Megatron-LM's bf16 preset, with gradients reduced in the --grad-reduce type. ConfigError naming
// both flags for a contradiction (--grad-reduce bf16 with --precision fp32), and for --precision
// bf16 naming `command`: the bf16 paths are not implemented yet, and a bf16 run that computed
// fp32 would report fp32 numbers under a bf16 label.
PrecisionPolicy precision_policy(const ProblemOptions& o, const std::string& command);
// --strategy (the strategy table's names), --ranks/-D, --tp, --sp.
void add_strategy_options(CLI::App& app, ProblemOptions& o);

// The simulated-clock flags: --sim-clock PRESET and overrides of its device and links; compare
// adds --nodes. A negative number (or 0 for nodes) means "the preset's".
struct SimClockArgs {
  std::string preset;  // "", or SimClockModel::kPresetNames
  double peak_tflops = -1;
  double mfu = -1;
  int gpus_per_node = -1;
  double intra_alpha_us = -1, intra_beta_gbs = -1;
  double inter_alpha_us = -1, inter_beta_gbs = -1;
  int nodes = 0;  // compare: the ranks spread contiguously over this many nodes
};
// --sim-clock --peak --mfu --gpus-per-node --intra-alpha-us --intra-beta-gbs --inter-alpha-us
// --inter-beta-gbs, and --nodes when with_nodes.
void add_sim_clock_options(CLI::App& app, SimClockArgs& a, bool with_nodes);
// nullopt without --sim-clock; the preset with the overrides for `ranks` ranks (--nodes N: N |
// ranks, ranks / N per node), validated; ConfigError naming the flag otherwise.
std::optional<SimClockModel> sim_clock_option(const SimClockArgs& a, int ranks);

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
