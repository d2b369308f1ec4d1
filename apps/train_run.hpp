// A training run: N optimizer steps of one strategy and of the single-thread reference side by
// side, on a token corpus, with every step checked against the fp64 oracle's trajectory.
//
// What runs: TSP — the whole model (TspModel: embedding, layers, LM head, mean cross-entropy of
//   the next token). The baselines exist as layer blocks only, so they train the layer stack of
//   the strategy table's block factory on a stand-in objective: the input is the frozen
//   (initial) embedding of each token and the loss the mean squared distance of the stack's
//   output to the frozen embedding of the next token, (1/2N)·Σ ||y - E[target]||², N = B·S,
//   dy = (y - E[target])/N computed by each rank on its own token rows. Every rank updates its
//   own shards with a ShardedOptimizer (AdamW or SGD, fp32 state in its arena); the reference
//   runs the same steps in float and in double (the oracle) with ref::Optimizer.
// Batches: step t (from 0) reads sequence b at corpus offset ((t·B + b)·S) mod (len - S), its
//   S tokens and the S next tokens as targets.
// The rule across steps (derived): the three runs start from the same float weights; at each
//   step t, after the update, every parameter tensor (and the step's loss) must satisfy
//       err(parallel_t) <= k · max_{s <= t} err(reference_s) + tiny(oracle_t)
//   with err the distance to the oracle's trajectory at the same step. Why the running max:
//   rounding errors compound through the updates, and both fp32 runs are carried by the same
//   dynamics from the same start, so each one's distance to the fp64 trajectory is its own
//   per-step rounding propagated by the same Jacobians — of the same size, but once training
//   turns chaotic each distance fluctuates from step to step around an exponentially growing
//   envelope, and the ratio of two such values at one step is not bounded by a small k (what the
//   default run showed: docs/design/numerics.md). The reference's largest error so far is that
//   envelope. A schedule bug moves the parallel trajectory away at the step it happens, while the
//   envelope is still small, and fails there.
//   The statistic: for the loss and after SGD updates the max absolute difference; after AdamW
//   updates the 99% quantile of the element errors (numerics.hpp, check_close_quantile): Adam's
//   step amplifies a gradient's rounding by up to lr/eps on the few elements with |g| ~ eps, so
//   the max (and even the RMS, which one such element dominates) is an extreme value of a handful
//   of elements, which fails the max and RMS rules from one element (docs/design/numerics.md).
//   tiny = 4 fp32 ulps of the oracle tensor's largest magnitude.
//   The run stops at the first step that breaks the rule, naming the tensor.
// Memory: after the first step, each rank's weights, gradients and optimizer bytes (its arena's
//   current bytes by category) against the planner's cost::parameter_state_bytes_per_rank for
//   the same configuration with PrecisionModel::fp32_emulator() — fp32 weights and gradients,
//   8 B per parameter held for AdamW's m and v, no master copy (SGD: no moments) — the whole
//   model for TSP, the layer stack (no vocabulary) for the baselines.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "layer_stack.hpp"
#include "tspemu/reference/optimizer.hpp"
#include "tspemu/tsp/parameter_shard.hpp"

namespace tspemu::app {

struct TrainConfig {
  StackConfig stack;  // model, B, S, strategy, seed, k, pin (on_step unused)
  // true: the strategy's whole model (strategy table's make_model), next-token cross-entropy;
  // false: its layer stack on the stand-in objective below.
  bool whole_model = true;
  ref::OptimizerConfig optimizer;
  int steps = 20;
  std::vector<std::int32_t> corpus;       // token ids in [0, vocab); at least S + 1 of them
  std::string corpus_name;                // for reports
  std::function<void(int step)> on_step;  // after each checked step (progress)
  // Debugging and tests: called on every rank after its update of step `step` (1-based) with
  // the shards it holds (a test corrupts one to see the run stop there).
  std::function<void(int step, int rank, std::span<const tsp::ParameterShard> shards)> after_update;
};

struct TrainStep {
  int step = 0;                                          // 1-based
  double loss = 0, reference_loss = 0, oracle_loss = 0;  // the step's loss, before its update
  double seconds = 0;                                    // parallel forward, backward, update
  double err_ratio = 0;  // max over the loss and every parameter of parallel err / bound
  std::string worst;     // the tensor with that ratio
};

struct ModelStateBytes {
  std::uint64_t weights = 0, gradients = 0, optimizer = 0;
  bool operator==(const ModelStateBytes&) const = default;
};

struct TrainResult {
  std::string scope;  // what trained
  std::vector<TrainStep> steps;
  double seconds = 0;                     // parallel, all steps
  double reference_seconds = 0;           // fp32 reference, all steps
  std::vector<ModelStateBytes> measured;  // per rank, after the first step
  ModelStateBytes planned;                // per rank (the same for every rank)
  bool memory_match = false;
  // The parallel run's weights after the last step taken (the layer stack: its trained layers
  // with the frozen embedding, final norm and head of the start).
  ref::ModelWeights<float> trained;
  bool ok = true;       // every step within the rule
  std::string failure;  // the first broken rule, naming the step and the tensor
  double max_err_ratio() const;
  bool pass() const { return ok && memory_match; }
};

// Throws std::invalid_argument for a configuration the strategy cannot run, steps < 1, a corpus
// shorter than S + 1 tokens or with an id outside the vocabulary (naming the index and value).
TrainResult run_training(const TrainConfig& c);

}  // namespace tspemu::app
