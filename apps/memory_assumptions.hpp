// The memory estimate's assumptions as command-line options, shared by `plan` and `paper`: named
// bundles (--assume default | megatron-mi300x | emulator), each field overridable by its own flag,
// and the sentences that state them, with their sources, in the output.
//
// Bundles:
//   default          bf16 mixed precision, 16 B/param (2 weights + 2 grads + 4 master + 8 Adam
//                    m, v: TSP-NOTES.md, ZeRO §3.1); full recompute; flash-style attention;
//                    fp32 logits and a separate fp32 gradient, not chunked; TSP shards the
//                    vocabulary; no framework overhead.
//   megatron-mi300x  what a Megatron-style stack on MI300X keeps: 18 B/param (fp32 main
//                    gradients), full recompute, flash attention, fp32 logits with the gradient
//                    written in place (Megatron's vocab-parallel cross-entropy); no overhead (the
//                    published-minus-estimate gap is shown instead of fitting one).
//   emulator         tspemu's own fp32 run: 4 + 4 + 0 + 8 B/param, fp32 activations, no
//                    recompute (the blocks keep their activations).
// Requirements: bytes >= 0, chunk >= 0 (ConfigError naming the flag otherwise).
#pragma once

#include "cli_fwd.hpp"

#include <optional>
#include <string>
#include <vector>

#include "tspemu/plan/cost_model.hpp"

namespace tspemu::app {

struct AssumptionArgs {
  std::string assume = "default";
  std::optional<double> weight_bytes, grad_bytes, master_bytes, moment_bytes, activation_bytes;
  std::optional<std::string> recompute;  // full | selective | none
  std::optional<std::string> attention;  // flash | materialized
  std::optional<double> logit_bytes;
  std::optional<bool> logits_in_place;
  std::optional<std::int64_t> logit_chunk;
  std::optional<std::string> tsp_vocab;           // sharded | replicated
  std::optional<std::string> framework_overhead;  // bytes with a unit, "0" allowed
  std::string units = "GB";                       // GB (1e9) or GiB (2^30) in tables
};

// Adds --assume and every override to cmd.
void add_assumption_options(CLI::App& cmd, AssumptionArgs& a);
// The bundle named by a.assume with a's overrides applied; ConfigError for bad values.
tsp::cost::MemoryAssumptions memory_assumptions(const AssumptionArgs& a);
// The bundle's name for a.assume ("default", "megatron-mi300x", "emulator"); ConfigError otherwise.
tsp::cost::MemoryAssumptions assumption_bundle(const std::string& name);
// One line per assumption, each with its source: what `plan` and `paper` print.
std::vector<std::string> describe(const tsp::cost::MemoryAssumptions& m);
// Bytes per table unit: 1e9 (GB) or 2^30 (GiB).
double unit_bytes(const std::string& units);
const char* recompute_name(tsp::cost::Recompute r);

}  // namespace tspemu::app
