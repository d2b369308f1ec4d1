// The executor runs every schedule of the planner on ranks and gives bitwise the loss and every
// gradient of the one-thread microbatch reference (pipeline_test_support.hpp), over p ∈ {2, 4} ×
// m ∈ {1, 2, p, 2p} (fewer microbatches than stages included), with tied embeddings and with a
// dp axis.
#include <gtest/gtest.h>

#include "pipeline_test_support.hpp"

namespace tspemu::pipeline::testing {
namespace {

void expect_bitwise(const PipeSetup& s) {
  SCOPED_TRACE(s.label());
  const ref::ModelConfig cfg = small_config(s);
  const auto w = ref::init_weights<float>(cfg, 11);
  const Data data = make_data(s, cfg.vocab);
  const Schedule schedule = make(s);
  const StepResult got = run_step(s, schedule, w, data);
  for (const std::string& f : got.failures) ASSERT_EQ(f, "");
  const ReferenceResult want = microbatch_reference(s, schedule, w, data);
  for (int d = 0; d < s.dp; ++d) {
    ASSERT_EQ(got.losses[std::size_t(d)].size(), std::size_t(s.m));
    for (int j = 0; j < s.m; ++j) {
      EXPECT_EQ(got.losses[std::size_t(d)][std::size_t(j)],
                want.losses[std::size_t(d)][std::size_t(j)])
          << "replica " << d << " microbatch " << j;
    }
  }
  EXPECT_EQ(first_record_difference(got.records, want.records, schedule.stages), "")
      << "every stage output, input gradient and accumulated gradient, per microbatch";
  EXPECT_EQ(first_bit_difference(got.grads, want.grads), "");
}

std::vector<int> microbatch_grid(int p) {
  return {1, 2, p, 2 * p};
}

TEST(PipelineExecutorBitwise, GPipeEqualsTheMicrobatchReferenceOverTheGrid) {
  for (int p : {2, 4}) {
    for (int m : microbatch_grid(p)) expect_bitwise({.kind = Kind::gpipe, .p = p, .m = m});
  }
}

TEST(PipelineExecutorBitwise, OneFOneBEqualsTheMicrobatchReferenceOverTheGrid) {
  for (int p : {2, 4}) {
    for (int m : microbatch_grid(p)) expect_bitwise({.kind = Kind::one_f_one_b, .p = p, .m = m});
  }
}

TEST(PipelineExecutorBitwise, InterleavedEqualsTheMicrobatchReferenceOverTheGrid) {
  for (int p : {2, 4}) {
    for (int m : microbatch_grid(p))
      expect_bitwise({.kind = Kind::interleaved_1f1b, .p = p, .m = m, .v = 2});
  }
}

TEST(PipelineExecutorBitwise, ZeroBubbleH1EqualsTheMicrobatchReferenceOverTheGrid) {
  for (int p : {2, 4}) {
    for (int m : microbatch_grid(p)) expect_bitwise({.kind = Kind::zb_h1, .p = p, .m = m});
  }
}

TEST(PipelineExecutorBitwise, TiedEmbeddingSumsTheFirstAndLastStagesParts) {
  expect_bitwise({.kind = Kind::one_f_one_b, .p = 4, .m = 4, .tied = true});
  expect_bitwise({.kind = Kind::interleaved_1f1b, .p = 2, .m = 4, .v = 2, .tied = true});
}

TEST(PipelineExecutorBitwise, DataParallelReplicasSumTheirGradientsInRankOrder) {
  expect_bitwise({.kind = Kind::one_f_one_b, .p = 2, .m = 2, .dp = 2});
  expect_bitwise({.kind = Kind::zb_h1, .p = 2, .m = 4, .dp = 2, .tied = true});
  expect_bitwise({.kind = Kind::interleaved_1f1b, .p = 2, .m = 2, .v = 2, .dp = 4});
}

}  // namespace
}  // namespace tspemu::pipeline::testing
