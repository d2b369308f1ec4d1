// Planted pipeline bugs are caught and named with stage, microbatch and tensor: a send to the
// wrong stage and a W before its B (refused by the executor's schedule check before any message
// moves), gradients scaled by 1/m twice (located by the per-microbatch comparison with the
// microbatch reference), the tied-embedding reduction left out (the final gradients), and a
// stage asked for W before its I (the dense stage's own refusal).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "pipeline_test_support.hpp"

namespace tspemu::pipeline::testing {
namespace {

// The index of the first action of `rank` matching (op, stage, microbatch).
std::size_t find_action(const Schedule& s, int rank, Op op, int stage, int mb) {
  const auto& list = s.actions[std::size_t(rank)];
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i].op == op && list[i].stage == stage && list[i].microbatch == mb) return i;
  }
  ADD_FAILURE() << "no " << op_name(op) << " of stage " << stage << " microbatch " << mb;
  return 0;
}

// Every rank's failure, all required to carry each of `parts`.
void expect_every_rank_fails_naming(const StepResult& r, std::initializer_list<std::string> parts) {
  for (std::size_t rank = 0; rank < r.failures.size(); ++rank) {
    for (const std::string& part : parts)
      EXPECT_NE(r.failures[rank].find(part), std::string::npos)
          << "rank " << rank << " failure: " << r.failures[rank] << "\nmissing: " << part;
  }
}

TEST(PipelinePlantedBugs, ASendToTheWrongStageIsRefusedNamingStageMicrobatchAndTensor) {
  const PipeSetup s{.kind = Kind::one_f_one_b, .p = 4, .m = 4};
  const ref::ModelConfig cfg = small_config(s);
  const auto w = ref::init_weights<float>(cfg, 1);
  Schedule bad = make(s);
  // Stage 1 sends microbatch 2's output to stage 3 instead of stage 2.
  bad.actions[1][find_action(bad, 1, Op::send_f, 1, 2)].peer_stage = 3;
  const StepResult r = run_step(s, bad, w, make_data(s, cfg.vocab));
  expect_every_rank_fails_naming(r, {"refused before any message moved", "stage 1", "microbatch 2",
                                     "1SEND_F2", "tensor: the activation from stage 1 [1, 8, 16]"});
}

TEST(PipelinePlantedBugs, AWeightPassBeforeItsInputGradientPassIsRefusedNamingStageAndTensor) {
  const PipeSetup s{.kind = Kind::zb_h1, .p = 2, .m = 2};
  const ref::ModelConfig cfg = small_config(s);
  const auto w = ref::init_weights<float>(cfg, 1);
  Schedule bad = make(s);
  auto& list = bad.actions[0];
  const std::size_t wi = find_action(bad, 0, Op::backward_weight, 0, 1);
  const std::size_t ii = find_action(bad, 0, Op::backward_input, 0, 1);
  const Action wpass = list[wi];
  list.erase(list.begin() + std::ptrdiff_t(wi));
  list.insert(list.begin() + std::ptrdiff_t(ii), wpass);  // W of microbatch 1 before its I
  const StepResult r = run_step(s, bad, w, make_data(s, cfg.vocab));
  expect_every_rank_fails_naming(
      r, {"stage 0", "microbatch 1", "0W1", "tensor: the weight gradients of stage 0"});
}

// A stage that divides its loss gradient by m again (the loss already scaled by the executor).
class ScaledTwiceStage final : public WrappedStage {
 public:
  ScaledTwiceStage(std::unique_ptr<DenseStage<float>> inner, int m)
      : WrappedStage(std::move(inner)), m_(m) {}
  void backward_input(int j, const ref::Batch& mb, std::span<const float> dy, std::span<float> dx,
                      double loss_scale) override {
    WrappedStage::backward_input(j, mb, dy, dx, loss_scale / m_);
  }

 private:
  int m_;
};

TEST(PipelinePlantedBugs, GradientsScaledByMTwiceAreLocatedAtTheLastStagesFirstMicrobatch) {
  const PipeSetup s{.kind = Kind::one_f_one_b, .p = 4, .m = 4};
  const ref::ModelConfig cfg = small_config(s);
  const auto w = ref::init_weights<float>(cfg, 1);
  const Data data = make_data(s, cfg.vocab);
  const Schedule schedule = make(s);
  const StageFactory twice = [](const ref::ModelWeights<float>& wt, StageSpan span, Arena& arena,
                                const PipeSetup& setup) {
    auto st = std::make_unique<ScaledTwiceStage>(dense(wt, span, arena, setup), setup.m);
    DenseStage<float>* d = st->dense();
    return HeldStage{std::move(st), d};
  };
  const StepResult got = run_step(s, schedule, w, data, {}, {}, twice);
  for (const std::string& f : got.failures) ASSERT_EQ(f, "");
  const ReferenceResult want = microbatch_reference(s, schedule, w, data);
  EXPECT_EQ(got.losses, want.losses) << "the loss curve does not show it";
  const std::string where = first_record_difference(got.records, want.records, schedule.stages);
  EXPECT_NE(where.find("stage 3, microbatch 0, tensor input gradient["), std::string::npos)
      << where;
  EXPECT_NE(where.find("(ratio 0.25)"), std::string::npos) << where;
}

TEST(PipelinePlantedBugs, TheTiedEmbeddingReductionLeftOutLeavesTheEmbeddingGradientWrong) {
  PipeSetup s{.kind = Kind::one_f_one_b, .p = 2, .m = 2, .tied = true};
  const ref::ModelConfig cfg = small_config(s);
  const auto w = ref::init_weights<float>(cfg, 1);
  const Data data = make_data(s, cfg.vocab);
  const Schedule schedule = make(s);
  const ReferenceResult want = microbatch_reference(s, schedule, w, data);
  s.tied = false;  // the executor is not told: no first + last sum
  const StepResult got = run_step(s, schedule, w, data);
  for (const std::string& f : got.failures) ASSERT_EQ(f, "");
  EXPECT_EQ(first_record_difference(got.records, want.records, schedule.stages), "")
      << "every microbatch's own work is right";
  EXPECT_EQ(first_bit_difference(got.grads, want.grads).rfind("model.embed_tokens.weight[", 0), 0u);
}

TEST(PipelinePlantedBugs, ADenseStageRefusesAWeightPassBeforeItsInputGradientPass) {
  const PipeSetup s{.kind = Kind::zb_h1, .p = 2, .m = 2};
  const ref::ModelConfig cfg = small_config(s);
  const auto w = ref::init_weights<float>(cfg, 1);
  Arena arena(0, std::size_t{1} << 26);
  DenseStage<float> st(w, stage_span(cfg.n_layers, 2, 1), s.micro_batch, s.seq, arena);
  try {
    st.backward_weight(1);
    FAIL() << "W before I accepted";
  } catch (const std::logic_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("stage 1 microbatch 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor layers.4.input_norm"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace tspemu::pipeline::testing

namespace tspemu::pipeline::testing {
namespace {

// A stage whose forward of one microbatch throws (a compute error in the middle of a schedule).
class ThrowingStage final : public WrappedStage {
 public:
  ThrowingStage(std::unique_ptr<DenseStage<float>> inner, int bad_mb)
      : WrappedStage(std::move(inner)), bad_mb_(bad_mb) {}
  double forward(int j, const ref::Batch& mb, std::span<const float> x,
                 std::span<float> y) override {
    if (j == bad_mb_)
      throw std::runtime_error("stage " + std::to_string(span().stage) + " microbatch " +
                               std::to_string(j) + ": planted compute error");
    return WrappedStage::forward(j, mb, x, y);
  }

 private:
  int bad_mb_;
};

// The failing rank's error ends the run on every rank (the others wake with PeerFailure from
// their receives), well before the hang watchdog would name a hang.
TEST(PipelinePlantedBugs, AStageThatThrowsMidScheduleFailsTheRunNotAHang) {
  const PipeSetup s{.kind = Kind::one_f_one_b, .p = 4, .m = 4};
  const ref::ModelConfig cfg = small_config(s);
  const auto w = ref::init_weights<float>(cfg, 1);
  const Data data = make_data(s, cfg.vocab);
  const Schedule schedule = make(s);
  World world({.ranks = s.p, .watchdog_timeout = std::chrono::milliseconds(20'000)});
  std::vector<std::unique_ptr<Stage<float>>> held(std::size_t(s.p));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    world.run([&](Rank& r) {
      const std::vector<ref::Batch> mbs = cut_microbatches(data.batch(), s.m);
      auto inner = dense(w, stage_span(cfg.n_layers, s.p, r.id()), r.arena(), s);
      held[std::size_t(r.id())] =
          std::make_unique<ThrowingStage>(std::move(inner), r.id() == 2 ? 1 : -1);
      Stage<float>* st = held[std::size_t(r.id())].get();
      run_pipeline<float>(r, r.comm(), nullptr, schedule, mbs,
                          std::span<Stage<float>* const>(&st, 1), PipelineOptions{});
    });
    FAIL() << "the run finished";
  } catch (const RankFailure& e) {
    EXPECT_EQ(e.rank(), 2);
    EXPECT_NE(e.diagnosis().find("stage 2 microbatch 1: planted compute error"), std::string::npos)
        << e.diagnosis();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
      << "ended by the failure, not by the watchdog";
}

}  // namespace
}  // namespace tspemu::pipeline::testing
