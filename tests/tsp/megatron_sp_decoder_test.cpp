// Megatron-SP decoding (megatron_sp_decoder.hpp) against the reference decoder
// (reference/decode.hpp), the fp64 oracle (the double reference) and the planner's closed forms
// (plan/decode_cost.hpp).
//
// Shapes: tp_decode_cases.hpp's, as TP's (small GQA models, L = 2, F = V = 96): T | NKV — T = 2 and
// 4 on NH=8, NKV=4, T = 3 on NH=6, NKV=3, T = 8 on NH=16, NKV=8 — and KV duplication, T > NKV with
// NKV | T — T = 4 and 8 on NH=8, NKV=2, T = 3 on NH=6, NKV=1 (MQA). Five prompts of lengths 1, 7,
// 13, 12, 16: B = 5 and the prefill's 49 rows divide by none of T = 2, 3, 4, 8, so every step
// runs padded rows; the batch-independence runs (B = 1) pad every decode step to T rows.
//
// Bounds (as tspw_decoder_test.cpp, whose file comment derives them):
//   - float logits per step, teacher-forced on the oracle's greedy tokens: err(Megatron-SP fp32)
//     <= 3·err(reference fp32) + tiny against the double reference (decode_test_support.hpp).
//   - double greedy tokens: equal to the double reference's for 256 steps.
//   - double KV cache: each rank's K and V of every position equal the reference cache's slice of
//     the rank's KV heads: layer 0 exactly (the embedding rows reduce-scattered with zeros, the
//     same per-row norm, all-gathered unchanged, the same dot products over C, RoPE at the same
//     global position), later layers within 1e-13 of the largest magnitude (their residual
//     carries o_proj and down sums split over T ranks, added in rank order).
//   - traffic and KV bytes: == (integers).
#include "tspemu/tsp/megatron_sp_decoder.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode_test_support.hpp"
#include "tp_decode_cases.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/tp_decoder.hpp"

namespace tspemu::tsp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::kCacheRtol;
using testing::kForcedSteps;
using testing::kTpCases;
using testing::longest;
using testing::Prompts;
using ::testing::ThrowsMessage;
using testing::tp_case_name;
using testing::tp_shape_for;
using testing::TpCase;

template <class T>
auto msp_factory(const DecodeShape& s, const ref::ModelWeights<T>& w) {
  return [&s, &w](Rank& rank) { return std::make_unique<BasicMegatronSpDecoder<T>>(rank, s, w); };
}

std::uint64_t msp_planned_kv_bytes(const TpCase& c, const Prompts& prompts,
                                   std::int64_t max_context, std::uint64_t beta) {
  return testing::tp_planner_kv_bytes(c, cost::DecodeStrategy::megatron_sp(c.T), prompts,
                                      max_context, beta);
}

std::string msp_label(const TpCase& c) {
  return "Megatron-SP T=" + std::to_string(c.T) + " NKV=" + std::to_string(c.NKV);
}

// The decoder's stages under the planner's names (decode_cost.cpp's megatron_sp entries).
std::vector<std::pair<std::string, const TrafficCounters*>> msp_named_stages(
    const MegatronSpTraffic& t) {
  return {{"QKV input all-gather", &t.qkv_gather},    {"W_O reduce-scatter", &t.o_proj},
          {"MLP input all-gather", &t.mlp_gather},    {"MLP down reduce-scatter", &t.mlp},
          {"embedding reduce-scatter", &t.embedding}, {"LM head input all-gather", &t.head_gather},
          {"LM head logits all-gather", &t.lm_head}};
}

// ---------------------------------------------------------------- shape validation

TEST(MegatronSpDecodeShape, RefusesTNeitherDividingNorAMultipleOfNkvNamingTAndNkv) {
  for (const TpCase c : {TpCase{3, 6, 2, 48}, TpCase{4, 12, 6, 48}}) {
    const DecodeShape s = tp_shape_for(c, 1, 8);
    const std::string t = "T=" + std::to_string(c.T), nkv = "NKV=" + std::to_string(c.NKV);
    EXPECT_THAT([&] { validate_megatron_sp(s); },
                ThrowsMessage<std::invalid_argument>(
                    AllOf(HasSubstr("Megatron-SP decode"), HasSubstr(t), HasSubstr(nkv))));
    const auto w = ref::init_weights<float>(s.model, 1);
    World world({.ranks = c.T});
    EXPECT_THROW(world.run([&](Rank& r) { MegatronSpDecoder dec(r, s, w); }), std::exception);
  }
}

// Padding, not refusal, for a batch that T does not divide.
TEST(MegatronSpDecodeShape, AcceptsTDividingNkvAndNkvDividingTWhateverTheBatch) {
  for (const TpCase& c : kTpCases)
    for (const int B : {1, 2, 3, 5, 8})
      EXPECT_NO_THROW(validate_megatron_sp(tp_shape_for(c, B, 8))) << c.T << " B=" << B;
}

TEST(MegatronSpDecodeShape, RefusesEveryOtherBadValueNamingIt) {
  auto bad = testing::common_bad_values<DecodeShape>();
  bad.insert(bad.end(), {{[](DecodeShape& s) { s.model.vocab = 98; }, "V=98"},
                         {[](DecodeShape& s) { s.model.ffn = 90; }, "F=90"},
                         {[](DecodeShape& s) { s.D = 16; }, "NH=8"},
                         {[](DecodeShape& s) { s.D = 0; }, "T=0"}});
  testing::expect_bad_values_refused("Megatron-SP decode", tp_shape_for(kTpCases[2], 2, 8),
                                     validate_megatron_sp, bad);
}

TEST(MegatronSpDecoder, BadInputIsRefusedNamingSequencePositionAndValue) {
  const DecodeShape s = tp_shape_for(kTpCases[0], 2, 8);
  const auto w = ref::init_weights<float>(s.model, 2);
  testing::expect_decoder_refuses_bad_input(2, msp_factory(s, w), "Megatron-SP decode");
  World wrong({.ranks = 4});
  EXPECT_THROW(wrong.run([&](Rank& r) { MegatronSpDecoder dec(r, s, w); }), std::exception);
}

// ---------------------------------------------------------------- float, teacher-forced

class MegatronSpDecodeFloat : public ::testing::TestWithParam<TpCase> {};

TEST_P(MegatronSpDecodeFloat, LogitsOfEveryStepTeacherForcedPassTheOracleRule) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = c.model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 5);
  const DecodeShape s =
      tp_shape_for(c, static_cast<int>(prompts.size()), longest(prompts) + kForcedSteps + 1);
  const auto w64 = ref::init_weights<double>(cfg, 11);
  const auto w32 = ref::init_weights<float>(cfg, 11);
  const testing::ForcedResult r = testing::judge_teacher_forced(
      msp_label(c), c.T, w64, w32, prompts, s.max_context, kForcedSteps, msp_factory(s, w32));
  std::cout << msp_label(c) << ": worst err(Megatron-SP fp32)/err(reference fp32) over " << r.steps
            << " steps " << r.worst_ratio << "\n";
}

INSTANTIATE_TEST_SUITE_P(Shapes, MegatronSpDecodeFloat, ::testing::ValuesIn(kTpCases),
                         tp_case_name);

// ---------------------------------------------------------------- double, free-running greedy

class MegatronSpDecodeGreedy : public ::testing::TestWithParam<TpCase> {};

// One double run of 256 free-running greedy steps per shape (B = 5: every decode step padded):
// the tokens against the reference's, every rank's logits against rank 0's (bitwise), every
// rank's cache against the reference cache's slice of its KV heads, and each rank's KV bytes
// against the planner and its arena.
TEST_P(MegatronSpDecodeGreedy, DoubleRunOf256StepsEqualsTheReferenceOnEveryRank) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = c.model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 7);
  const DecodeShape s = tp_shape_for(c, static_cast<int>(prompts.size()),
                                     longest(prompts) + testing::kGreedySteps + 3);
  const auto w = ref::init_weights<double>(cfg, 13);
  testing::judge_greedy_run(
      msp_label(c), c.T, w, prompts, s.max_context, kCacheRtol, msp_factory(s, w),
      [](Rank& /*rank*/, const BasicMegatronSpDecoder<double>& dec) { return dec.first_kv_head(); },
      [&](int /*r*/) { return msp_planned_kv_bytes(c, prompts, s.max_context, sizeof(double)); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, MegatronSpDecodeGreedy, ::testing::ValuesIn(kTpCases),
                         tp_case_name);

// ---------------------------------------------------------------- traffic, determinism

class MegatronSpDecodeTraffic : public ::testing::TestWithParam<TpCase> {};

// Every stage of every decode step (B = 5 rows, padded), on every rank, equals the planner's
// decode_stage_traffic(megatron_sp(T)), the totals decode_step_traffic, and each rank's KV bytes
// the planner's per-token bytes over B·max_context positions.
TEST_P(MegatronSpDecodeTraffic, EveryStageOfEveryDecodeStepOnEveryRankEqualsThePlannersClosedForm) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = c.model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 11);
  const int steps = 4;
  const DecodeShape s =
      tp_shape_for(c, static_cast<int>(prompts.size()), longest(prompts) + steps + 1);
  const auto w = ref::init_weights<float>(cfg, 29);
  testing::judge_decode_traffic(
      msp_label(c), c.T, cfg, cost::DecodeStrategy::megatron_sp(c.T), prompts, s.max_context, steps,
      msp_factory(s, w), msp_named_stages,
      [&](int /*r*/) { return msp_planned_kv_bytes(c, prompts, s.max_context, sizeof(float)); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, MegatronSpDecodeTraffic, ::testing::ValuesIn(kTpCases),
                         tp_case_name);

class MegatronSpPrefillTraffic : public ::testing::TestWithParam<TpCase> {};

// The prefill (49 rows, padded), on every rank: each stage equals the planner's
// megatron_sp_prefill_stage_traffic.
TEST_P(MegatronSpPrefillTraffic, EveryStageOnEveryRankEqualsThePlannersClosedForm) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = c.model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 11);
  const int B = static_cast<int>(prompts.size());
  const DecodeShape s = tp_shape_for(c, B, longest(prompts) + 1);
  const auto w = ref::init_weights<float>(cfg, 29);
  const cost::ModelShape ms = cost::ModelShape::from(cfg, B, s.max_context);
  std::vector<std::vector<std::string>> findings(static_cast<std::size_t>(c.T));
  std::vector<int> checked(static_cast<std::size_t>(c.T), 0);
  World world({.ranks = c.T});
  world.run([&](Rank& rank) {
    const int r = rank.id();
    MegatronSpDecoder dec(rank, s, w);
    (void)dec.prefill(prompts);
    const auto want = cost::megatron_sp_prefill_stage_traffic(ms, c.T, testing::lengths_of(prompts),
                                                              sizeof(float), r);
    TrafficCounters total;
    for (const auto& stage : want) total += stage.traffic;
    const MegatronSpTraffic& got = dec.last_traffic();
    const auto f = testing::stage_findings(msp_label(c) + " rank " + std::to_string(r) + " prefill",
                                           msp_named_stages(got), got.total(), want, total);
    auto& out = findings[static_cast<std::size_t>(r)];
    out.insert(out.end(), f.begin(), f.end());
    ++checked[static_cast<std::size_t>(r)];
  });
  testing::expect_no_findings(findings, checked, 1);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MegatronSpPrefillTraffic, ::testing::ValuesIn(kTpCases),
                         tp_case_name);

TEST(MegatronSpDecoder, TwoRunsAreBitwiseIdentical) {
  const TpCase c = kTpCases[5];  // T=8 on NKV=2: duplicated KV heads
  const ref::ModelConfig cfg = c.model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 9);
  const DecodeShape s = tp_shape_for(c, static_cast<int>(prompts.size()), longest(prompts) + 20);
  const auto w = ref::init_weights<float>(cfg, 17);
  testing::expect_deterministic(c.T, msp_factory(s, w), prompts, 16);
}

// B = 1 alone and B = 5 together: different paddings, the same logits bit for bit.
TEST(MegatronSpDecoder, ASequencesLogitsDoNotDependOnItsBatchMatesInDouble) {
  const TpCase c = kTpCases[4];  // T=4 on NKV=2
  const int steps = 24;
  const ref::ModelConfig cfg = c.model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 3);
  const auto w = ref::init_weights<double>(cfg, 19);
  const std::int64_t max_context = longest(prompts) + steps + 1;
  testing::expect_batch_independent(prompts, {0, 2}, [&](const Prompts& p) {
    const DecodeShape s = tp_shape_for(c, static_cast<int>(p.size()), max_context);
    return testing::run_decoder<double>(c.T, msp_factory(s, w), p, steps);
  });
}

}  // namespace
}  // namespace tspemu::tsp
