// Shapes several planner test files use, defined once so the test program can compile as a unity
// build (tests/CMakeLists.txt).
#pragma once

#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/plan/pipeline_check.hpp"

namespace tspemu::plan_testing {

// A small GQA model (NKV < NH) whose dimensions divide by the degrees the traffic tests use.
inline tsp::cost::ModelShape small_gqa() {
  tsp::cost::ModelShape m;
  m.hidden = 64;
  m.n_heads = 8;
  m.n_kv_heads = 4;
  m.ffn = 96;
  m.layers = 3;
  m.vocab = 48;
  return m;
}

// The activation a pipeline stage sends in the schedule tests.
inline const pipeline::ActivationShape kShape{2, 8, 16};

}  // namespace tspemu::plan_testing
