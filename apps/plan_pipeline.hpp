// `tspemu plan --pp P`: a pipeline schedule (plan/pipeline_schedule.hpp) for the plan command's
// model, checked (pipeline_check.hpp) and timed (pipeline_clock.hpp), no ranks run. For
// --schedule gpipe, 1f1b, interleaved-1f1b (--virtual-stages v, 2 unless given) or zb-h1 over P
// ranks and --microbatches m (default: --batch, one sequence each) of the --batch sequences of
// --seq tokens: the layers per stage, the checker's verdict, every rank's bubble from the
// simulated clock at uniform stage costs (F = 1, B = 2, or I = W = 1) beside the closed form,
// and per rank the activations kept for backward at its peak — the (stage, microbatch) pairs it
// holds at once × a stage's layers × one layer's kept bytes for one microbatch (layer_memory on
// one device under --recompute: none keeps the whole set, selective drops the attention softmax,
// full keeps the layer input).
//
// Requirements: the plan command's checks of the model (plan_shape); P·v stages dividing
// --layers (uniform stages: the clock's premise) and at most --layers; m dividing --batch; the
// schedule's own rules (refusal()); none of --inference, --sweep, --dry-run, --json. Each
// violation is a ConfigError naming the flags and values (exit 2).
// Guarantees: the report is computed whole before anything is written.
// Cost: O(P·v·m) actions; milliseconds.
#pragma once

#include <iosfwd>

#include "plan_command.hpp"

namespace tspemu::app {

int plan_pipeline_command(const PlanArgs& a, std::ostream& out);

}  // namespace tspemu::app
