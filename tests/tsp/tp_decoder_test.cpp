// TP decoding (tp_decoder.hpp) against the reference decoder (reference/decode.hpp), the fp64
// oracle (the double reference) and the planner's closed forms (plan/decode_cost.hpp).
//
// Shapes (small GQA models, L = 2, F = V = 96): T | NKV — T = 2 and 4 on NH=8, NKV=4, T = 3 on
// NH=6, NKV=3, T = 8 on NH=16, NKV=8 (the TSP-W tests' models) — and KV duplication, T > NKV with
// NKV | T — T = 4 and 8 on NH=8, NKV=2 (2 and 4 copies of each KV head), T = 3 on NH=6, NKV=1
// (MQA, 3 copies). Five prompts of lengths 1, 7, 13, 12, 16.
//
// Bounds (as tspw_decoder_test.cpp, whose file comment derives them):
//   - float logits per step, teacher-forced on the oracle's greedy tokens: err(TP fp32) <=
//     3·err(reference fp32) + tiny against the double reference (decode_test_support.hpp).
//   - double greedy tokens: equal to the double reference's for 256 steps.
//   - double KV cache: each rank's K and V of every position equal the reference cache's slice of
//     the rank's KV heads: layer 0 exactly (the same dot products over C, RoPE at the same global
//     position), later layers within 1e-13 of the largest magnitude (their residual carries
//     o_proj and down sums split over T ranks, added in rank order).
//   - traffic and KV bytes: == (integers).
#include "tspemu/tsp/tp_decoder.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "decode_test_support.hpp"
#include "tp_decode_cases.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::tsp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::kCacheRtol;
using testing::kForcedSteps;
using testing::kGreedySteps;
using testing::kTpCases;
using testing::longest;
using testing::Prompts;
using ::testing::ThrowsMessage;
using testing::tp_case_name;
using testing::tp_shape_for;

using testing::TpCase;

template <class T>
auto tp_factory(const DecodeShape& s, const ref::ModelWeights<T>& w) {
  return [&s, &w](Rank& rank) { return std::make_unique<BasicTpDecoder<T>>(rank, s, w); };
}

// The planner's KV cache bytes of a TP rank: every position below max_context of the B sequences.
std::uint64_t tp_planned_kv_bytes(const TpCase& c, const Prompts& prompts, std::int64_t max_context,
                                  std::uint64_t beta) {
  return testing::tp_planner_kv_bytes(c, cost::DecodeStrategy::tp(c.T), prompts, max_context, beta);
}

// The stages of a TP decode step under the planner's names.
std::vector<std::pair<std::string, const TrafficCounters*>> tp_named_stages(const TpTraffic& t) {
  return {{"W_O all-reduce", &t.o_proj},
          {"MLP down all-reduce", &t.mlp},
          {"embedding all-reduce", &t.embedding},
          {"LM head logits all-gather", &t.lm_head}};
}

// ---------------------------------------------------------------- shape validation

TEST(TpDecodeShape, RefusesTNeitherDividingNorAMultipleOfNkvNamingTAndNkv) {
  for (const TpCase c : {TpCase{3, 6, 2, 48}, TpCase{4, 12, 6, 48}}) {
    const DecodeShape s = tp_shape_for(c, 1, 8);
    const std::string t = "T=" + std::to_string(c.T), nkv = "NKV=" + std::to_string(c.NKV);
    EXPECT_THAT([&] { validate_tp(s); },
                ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr(t), HasSubstr(nkv))));
    const auto w = ref::init_weights<float>(s.model, 1);
    World world({.ranks = c.T});
    EXPECT_THROW(world.run([&](Rank& r) { TpDecoder dec(r, s, w); }), std::exception);
  }
}

TEST(TpDecodeShape, AcceptsTDividingNkvAndNkvDividingT) {
  for (const TpCase& c : kTpCases) EXPECT_NO_THROW(validate_tp(tp_shape_for(c, 1, 8))) << c.T;
  EXPECT_EQ(tp_kv_heads_per_rank(testing::small_gqa_model(8, 4, 64), 2), 2);
  EXPECT_EQ(tp_kv_heads_per_rank(testing::small_gqa_model(8, 2, 64), 8), 1);
}

TEST(TpDecodeShape, RefusesEveryOtherBadValueNamingIt) {
  auto bad = testing::common_bad_values<DecodeShape>();
  bad.insert(bad.end(), {{[](DecodeShape& s) { s.model.vocab = 98; }, "V=98"},
                         {[](DecodeShape& s) { s.model.ffn = 90; }, "F=90"},
                         {[](DecodeShape& s) { s.D = 16; }, "NH=8"},
                         {[](DecodeShape& s) { s.D = 0; }, "T=0"}});
  testing::expect_bad_values_refused("TP decode", tp_shape_for(kTpCases[2], 2, 8), validate_tp,
                                     bad);
}

TEST(TpDecoder, BadInputIsRefusedNamingSequencePositionAndValue) {
  const DecodeShape s = tp_shape_for(kTpCases[0], 2, 8);
  const auto w = ref::init_weights<float>(s.model, 2);
  testing::expect_decoder_refuses_bad_input(2, tp_factory(s, w), "TP decode");
  World wrong({.ranks = 4});
  EXPECT_THROW(wrong.run([&](Rank& r) { TpDecoder dec(r, s, w); }), std::exception);
}

// ---------------------------------------------------------------- float, teacher-forced

class TpFloat : public ::testing::TestWithParam<TpCase> {};

TEST_P(TpFloat, LogitsOfEveryStepTeacherForcedPassTheOracleRule) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 5);
  const DecodeShape s =
      tp_shape_for(c, static_cast<int>(prompts.size()), longest(prompts) + kForcedSteps + 1);
  const auto w64 = ref::init_weights<double>(cfg, 11);
  const auto w32 = ref::init_weights<float>(cfg, 11);
  const testing::ForcedResult r = testing::judge_teacher_forced(
      "T=" + std::to_string(c.T) + " NKV=" + std::to_string(c.NKV), c.T, w64, w32, prompts,
      s.max_context, kForcedSteps, tp_factory(s, w32));
  std::cout << "T=" << c.T << " NKV=" << c.NKV << ": worst err(TP fp32)/err(reference fp32) over "
            << r.steps << " steps " << r.worst_ratio << "\n";
}

INSTANTIATE_TEST_SUITE_P(Shapes, TpFloat, ::testing::ValuesIn(kTpCases), tp_case_name);

// ---------------------------------------------------------------- double, free-running greedy

class TpGreedy : public ::testing::TestWithParam<TpCase> {};

// One double run of 256 free-running greedy steps per shape: the tokens against the reference's,
// every rank's logits against rank 0's (bitwise), every rank's cache against the reference
// cache's slice of its KV heads, and each rank's KV bytes against the planner and its arena.
TEST_P(TpGreedy, DoubleRunOf256StepsEqualsTheReferenceOnEveryRank) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 7);
  const DecodeShape s =
      tp_shape_for(c, static_cast<int>(prompts.size()), longest(prompts) + kGreedySteps + 3);
  const auto w = ref::init_weights<double>(cfg, 13);
  const std::string label = "T=" + std::to_string(c.T) + " NKV=" + std::to_string(c.NKV);
  testing::judge_greedy_run(
      label, c.T, w, prompts, s.max_context, kCacheRtol, tp_factory(s, w),
      [](Rank& /*rank*/, const BasicTpDecoder<double>& dec) { return dec.first_kv_head(); },
      [&](int /*r*/) { return tp_planned_kv_bytes(c, prompts, s.max_context, sizeof(double)); });
  std::cout << label << ": " << tp_kv_heads_per_rank(cfg, c.T) << " KV heads per rank, "
            << (c.T > c.NKV ? c.T / c.NKV : 1) << " copies of each\n";
}

INSTANTIATE_TEST_SUITE_P(Shapes, TpGreedy, ::testing::ValuesIn(kTpCases), tp_case_name);

// ---------------------------------------------------------------- traffic, determinism

class TpTrafficModel : public ::testing::TestWithParam<TpCase> {};

// Every stage of every decode step, on every rank, equals the planner's
// decode_stage_traffic(tp(T)) for the step's B new tokens, the totals equal decode_step_traffic,
// and each rank's KV bytes equal the planner's per-token bytes over B·max_context positions.
TEST_P(TpTrafficModel, EveryStageOfEveryDecodeStepOnEveryRankEqualsThePlannersClosedForm) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 11);
  const int steps = 4;
  const DecodeShape s =
      tp_shape_for(c, static_cast<int>(prompts.size()), longest(prompts) + steps + 1);
  const auto w = ref::init_weights<float>(cfg, 29);
  testing::judge_decode_traffic(
      "T=" + std::to_string(c.T), c.T, cfg, cost::DecodeStrategy::tp(c.T), prompts, s.max_context,
      steps, tp_factory(s, w), tp_named_stages,
      [&](int /*r*/) { return tp_planned_kv_bytes(c, prompts, s.max_context, sizeof(float)); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, TpTrafficModel, ::testing::ValuesIn(kTpCases), tp_case_name);

TEST(TpDecoder, TwoRunsAreBitwiseIdentical) {
  const TpCase c = kTpCases[5];  // T=8 on NKV=2: duplicated KV heads
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 9);
  const DecodeShape s = tp_shape_for(c, static_cast<int>(prompts.size()), longest(prompts) + 20);
  const auto w = ref::init_weights<float>(cfg, 17);
  testing::expect_deterministic(c.T, tp_factory(s, w), prompts, 16);
}

TEST(TpDecoder, ASequencesLogitsDoNotDependOnItsBatchMatesInDouble) {
  const TpCase c = kTpCases[4];  // T=4 on NKV=2
  const int steps = 24;
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 3);
  const auto w = ref::init_weights<double>(cfg, 19);
  const std::int64_t max_context = longest(prompts) + steps + 1;
  testing::expect_batch_independent(prompts, {0, 2}, [&](const Prompts& p) {
    const DecodeShape s = tp_shape_for(c, static_cast<int>(p.size()), max_context);
    return testing::run_decoder<double>(c.T, tp_factory(s, w), p, steps);
  });
}

}  // namespace
}  // namespace tspemu::tsp
