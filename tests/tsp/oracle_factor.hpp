// The k of the fp64-oracle rule (reference/numerics.hpp: err(parallel) <= k · err(reference) +
// tiny) for every strategy's tests here: the blocks (strategy_checks.hpp), the whole models, the
// sequence-attention cores, the sharded optimizer and the decoders (decode_test_support.hpp).
// Test-only.
//
// Requirements: none. Guarantees: one definition, so the test files of tsp_tests can be compiled
// together (a unity build) and cannot drift apart. Cost: none.
#pragma once

namespace tspemu::tsp::testing {

// Every strategy only reorders sums (partial o_proj / down_proj per shard, K/V-gradient and
// weight-gradient reductions across ranks), so its error against the oracle is of the
// reference's own order; 3 leaves room for the luck of rounding without hiding a real bug, which
// shows up as errors orders of magnitude larger.
inline constexpr double kOracleFactor = 3.0;

}  // namespace tspemu::tsp::testing
