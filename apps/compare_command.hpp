// `tspemu compare`: every strategy on one configuration and N ranks, side by side — the strategy
// table's strategies_at(N) (strategy.hpp): TSP D=N, TP T=N, Megatron-SP T=N, SP Sp=N, Ulysses
// n=N, ring attention n=N and every TP+SP factorization T×Sp=N with T, Sp > 1 — each the whole
// model (model_run.hpp; --layers-only: the layer stack, layer_stack.hpp) checked like `run`; a
// strategy the shape does not allow is a row with the reason. With --inference: every decode
// strategy on the same prompts instead (compare_inference.hpp).
//
// Guarantees: the flags of one mode beside the other's (--new-tokens without --inference; --batch,
//   --seq, --layout, --head-buckets, --serial-attention, --layers-only or the simulated clock's
//   with it) are refused naming the flag (ConfigError, exit 2) before anything runs.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "generate_command.hpp"
#include "problem_options.hpp"

namespace tspemu::app {

struct CompareArgs {
  ProblemOptions problem;
  bool layers_only = false;
  bool no_check = false;
  bool quiet = false;
  std::string json_path;
  SimClockArgs sim_clock;  // --sim-clock and its overrides: adds the simulated step
  bool inference = false;  // --inference: the decode strategies instead
  GenerateArgs decode;     // --inference: the decoding flags (add_decode_options)
  // Set by add_compare_command: the flags of each mode, to refuse them in the other.
  std::vector<const CLI::Option*> decode_flags, training_flags;
};

CLI::App* add_compare_command(CLI::App& app, CompareArgs& a);
// 0: every strategy that ran passed; 1 otherwise.
int compare_command(const CompareArgs& a, std::ostream& out);

}  // namespace tspemu::app
