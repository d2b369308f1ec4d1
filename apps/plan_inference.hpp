// `tspemu plan --inference`: the decode cost model (plan/decode_cost.hpp) at real sizes, no ranks
// run. For the plan command's model (preset and overrides) on --devices N of --device-mem each,
// B = --batch sequences of S = --seq cached tokens, elements of --element-bytes: per inference
// schedule (TP N, SP N, every TP+SP and Helix factorization of N, TSP-M N, TSP-W N) the weights
// and KV cache per rank, the KV duplication, the longest context that fits, the decode step's
// bytes per device (ring convention; the fp32 LSE and the vocabulary parts apart), collectives
// per layer, HBM bytes read per step, and prefill bytes per layer; each collective in detail.
//
// Requirements: the plan command's checks of the model (plan_shape), --element-bytes 1, 2 or 4,
// and neither --sweep nor --dry-run (ConfigError naming the flag: exit 2). A schedule the shape
// does not suit is listed as skipped with the reason, the others still reported.
// Guarantees: the report is computed whole before anything is written (text, then --json).
// Cost: O(schedules · collectives); microseconds.
#pragma once

#include <iosfwd>

#include "plan_command.hpp"

namespace tspemu::app {

int plan_inference_command(const PlanArgs& a, std::ostream& out);

}  // namespace tspemu::app
