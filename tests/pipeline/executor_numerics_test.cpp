// The pipelined step against the full-batch reference, by the oracle rule (reference/numerics.hpp):
// err(pipelined vs fp64 oracle) <= k · err(fp32 reference vs oracle) + tiny, k = 3 as for the
// other whole-model checks — microbatching only regroups the batch's sums (per-microbatch
// gradients accumulated; the loss scale 1/(m·dp) is a power of two here, so exact).
#include <gtest/gtest.h>

#include "../tsp/model_checks.hpp"
#include "pipeline_test_support.hpp"

namespace tspemu::pipeline::testing {
namespace {

constexpr double kPipelineOracleFactor = 3.0;

void expect_within_rule(const PipeSetup& s) {
  SCOPED_TRACE(s.label());
  const ref::ModelConfig cfg = small_config(s);
  const auto w = ref::init_weights<float>(cfg, 5);
  const Data data = make_data(s, cfg.vocab, 13);
  const StepResult got = run_step(s, make(s), w, data);
  for (const std::string& f : got.failures) ASSERT_EQ(f, "");
  double loss = 0;  // the global batch's mean: every microbatch has the same token count
  for (const auto& replica : got.losses) {
    for (double l : replica) loss += l;
  }
  loss /= double(s.m * s.dp);
  tsp::testing::expect_model_passes_oracle_rule(loss, got.grads, w, data.B, data.T, data.tokens,
                                                data.targets, kPipelineOracleFactor);
}

TEST(PipelineExecutorNumerics, EverySchedulePassesTheOracleRuleAgainstTheFullBatch) {
  expect_within_rule({.kind = Kind::gpipe, .p = 4, .m = 8});
  expect_within_rule({.kind = Kind::one_f_one_b, .p = 4, .m = 2});
  expect_within_rule({.kind = Kind::interleaved_1f1b, .p = 2, .m = 4, .v = 2});
  expect_within_rule({.kind = Kind::zb_h1, .p = 2, .m = 4});
}

TEST(PipelineExecutorNumerics, TiedEmbeddingAndDataParallelPassTheOracleRule) {
  expect_within_rule({.kind = Kind::one_f_one_b, .p = 2, .m = 4, .tied = true});
  expect_within_rule({.kind = Kind::one_f_one_b, .p = 2, .m = 2, .dp = 2, .tied = true});
}

}  // namespace
}  // namespace tspemu::pipeline::testing
