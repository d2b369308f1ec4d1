// Megatron-SP decoding (megatron_sp_decoder.hpp) against the reference decoder
// (reference/decode.hpp), the fp64 oracle (the double reference) and the planner's closed forms
// (plan/decode_cost.hpp).
//
// Shapes: tp_decoder_test.cpp's (small GQA models, L = 2, F = V = 96): T | NKV — T = 2 and 4 on
// NH=8, NKV=4, T = 3 on NH=6, NKV=3, T = 8 on NH=16, NKV=8 — and KV duplication, T > NKV with
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

#include <cmath>
#include <iostream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode_test_support.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/tp_decoder.hpp"

namespace tspemu::tsp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::kGreedySteps;
using testing::longest;
using testing::Prompts;
using ::testing::ThrowsMessage;

constexpr double kCacheRtol = 1e-13;  // tspw_decoder_test.cpp's, same argument
constexpr int kForcedSteps = 24;

struct TpCase {
  int T, NH, NKV, hidden;
};

std::string case_name(const ::testing::TestParamInfo<TpCase>& i) {
  return "T" + std::to_string(i.param.T) + "_NH" + std::to_string(i.param.NH) + "_NKV" +
         std::to_string(i.param.NKV);
}

const TpCase kCases[] = {{2, 8, 4, 64}, {3, 6, 3, 48}, {4, 8, 4, 64}, {8, 16, 8, 64},
                         {4, 8, 2, 64}, {8, 8, 2, 64}, {3, 6, 1, 48}};

DecodeShape shape_for(const TpCase& c, int B, std::int64_t max_context) {
  return DecodeShape{.model = testing::small_gqa_model(c.NH, c.NKV, c.hidden),
                     .D = c.T,
                     .batch = B,
                     .max_context = max_context,
                     .interleave = 1};
}

template <class T>
auto msp_factory(const DecodeShape& s, const ref::ModelWeights<T>& w) {
  return [&s, &w](Rank& rank) { return std::make_unique<BasicMegatronSpDecoder<T>>(rank, s, w); };
}

// The planner's KV cache bytes of a Megatron-SP rank (TP's cache): every position below
// max_context of the B sequences.
std::uint64_t planner_kv_bytes(const ref::ModelConfig& cfg, int B, std::int64_t max_context, int T,
                               std::uint64_t beta) {
  const cost::ModelShape ms = cost::ModelShape::from(cfg, B, max_context);
  return testing::planner_kv_cache_bytes(
      cfg.n_layers, static_cast<std::uint64_t>(B) * static_cast<std::uint64_t>(max_context),
      cost::kv_bytes_per_token_layer(ms, cost::DecodeStrategy::megatron_sp(T), beta));
}

// ---------------------------------------------------------------- shape validation

TEST(MegatronSpDecodeShape, RefusesTNeitherDividingNorAMultipleOfNkvNamingTAndNkv) {
  for (const TpCase c : {TpCase{3, 6, 2, 48}, TpCase{4, 12, 6, 48}}) {
    const DecodeShape s = shape_for(c, 1, 8);
    const std::string t = "T=" + std::to_string(c.T), nkv = "NKV=" + std::to_string(c.NKV);
    EXPECT_THAT([&] { validate_megatron_sp(s); },
                ThrowsMessage<std::invalid_argument>(
                    AllOf(HasSubstr("Megatron-SP decode"), HasSubstr(t), HasSubstr(nkv))));
    const auto w = ref::init_weights<float>(s.model, 1);
    World world({.ranks = c.T});
    EXPECT_THROW(world.run([&](Rank& r) { MegatronSpDecoder dec(r, s, w); }), std::exception);
  }
}

TEST(MegatronSpDecodeShape, AcceptsTDividingNkvAndNkvDividingTWhateverTheBatch) {
  for (const TpCase& c : kCases)
    for (const int B : {1, 2, 3, 5, 8})
      EXPECT_NO_THROW(validate_megatron_sp(shape_for(c, B, 8))) << c.T << " B=" << B;
}

TEST(MegatronSpDecodeShape, RefusesEveryOtherBadValueNamingIt) {
  const DecodeShape good = shape_for(kCases[2], 2, 8);
  auto fails = [](DecodeShape s, const char* what) {
    EXPECT_THAT([&] { validate_megatron_sp(s); },
                ThrowsMessage<std::invalid_argument>(HasSubstr(what)));
  };
  DecodeShape s = good;
  s.model.vocab = 98;
  fails(s, "V=98");
  s = good;
  s.model.ffn = 90;
  fails(s, "F=90");
  s = good;
  s.D = 16;
  fails(s, "NH=8");
  s = good;
  s.max_context = 0;
  fails(s, "max_context=0");
  s = good;
  s.batch = 0;
  fails(s, "B=0");
  s = good;
  s.D = 0;
  fails(s, "T=0");
}

TEST(MegatronSpDecoder, BadInputIsRefusedNamingSequencePositionAndValue) {
  const DecodeShape s = shape_for(kCases[0], 2, 8);
  const auto w = ref::init_weights<float>(s.model, 2);
  World world({.ranks = 2});
  world.run([&](Rank& r) {
    MegatronSpDecoder dec(r, s, w);
    testing::expect_bad_input_refused(dec, "Megatron-SP decode");
  });
  World wrong({.ranks = 4});
  EXPECT_THROW(wrong.run([&](Rank& r) { MegatronSpDecoder dec(r, s, w); }), std::exception);
}

// ---------------------------------------------------------------- float, teacher-forced

class MegatronSpDecodeFloat : public ::testing::TestWithParam<TpCase> {};

TEST_P(MegatronSpDecodeFloat, LogitsOfEveryStepTeacherForcedPassTheOracleRule) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 5);
  const DecodeShape s =
      shape_for(c, static_cast<int>(prompts.size()), longest(prompts) + kForcedSteps + 1);
  const auto w64 = ref::init_weights<double>(cfg, 11);
  const auto w32 = ref::init_weights<float>(cfg, 11);
  const testing::ForcedResult r = testing::judge_teacher_forced(
      "Megatron-SP T=" + std::to_string(c.T) + " NKV=" + std::to_string(c.NKV), c.T, w64, w32,
      prompts, s.max_context, kForcedSteps, msp_factory(s, w32));
  std::cout << "T=" << c.T << " NKV=" << c.NKV
            << ": worst err(Megatron-SP fp32)/err(reference fp32) over " << r.steps << " steps "
            << r.worst_ratio << "\n";
}

INSTANTIATE_TEST_SUITE_P(Shapes, MegatronSpDecodeFloat, ::testing::ValuesIn(kCases), case_name);

// ---------------------------------------------------------------- double, free-running greedy

class MegatronSpDecodeGreedy : public ::testing::TestWithParam<TpCase> {};

// One double run of 256 free-running greedy steps per shape: the tokens against the reference's,
// every rank's logits against rank 0's (bitwise), every rank's cache against the reference
// cache's slice of its KV heads, and each rank's KV bytes against the planner and its arena.
TEST_P(MegatronSpDecodeGreedy, DoubleRunOf256StepsEqualsTheReferenceOnEveryRank) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 7);
  const int B = static_cast<int>(prompts.size());
  const DecodeShape s = shape_for(c, B, longest(prompts) + kGreedySteps + 3);
  const auto w = ref::init_weights<double>(cfg, 13);
  std::mutex m;
  std::vector<std::string> cache_errors;
  auto inspect = [&](Rank& rank, const BasicMegatronSpDecoder<double>& dec,
                     const ref::Generation<double>& oracle) {
    double worst = 0;
    const auto e =
        testing::cache_mismatches(rank.id(), dec.cache(), dec.first_kv_head(), oracle.cache,
                                  testing::max_magnitude(oracle.cache), kCacheRtol, worst);
    const std::lock_guard lock(m);
    cache_errors.insert(cache_errors.end(), e.begin(), e.end());
  };
  const auto g =
      testing::run_greedy(c.T, w, prompts, s.max_context, kGreedySteps, msp_factory(s, w), inspect);
  const std::string label =
      "Megatron-SP T=" + std::to_string(c.T) + " NKV=" + std::to_string(c.NKV);
  ASSERT_NO_FATAL_FAILURE(testing::expect_greedy_equals_oracle(label, g, kGreedySteps));
  for (const std::string& e : cache_errors) ADD_FAILURE() << e;

  const std::uint64_t want = planner_kv_bytes(cfg, B, s.max_context, c.T, sizeof(double));
  for (int r = 0; r < c.T; ++r) {
    EXPECT_EQ(g.runs[static_cast<std::size_t>(r)].kv_cache_bytes, want) << "rank " << r;
    EXPECT_EQ(g.runs[static_cast<std::size_t>(r)].arena_kv_cache, want) << "rank " << r;
  }
  std::cout << label << ": kv cache " << g.runs[0].kv_cache_bytes << " B per rank ("
            << tp_kv_heads_per_rank(cfg, c.T) << " KV heads, " << (c.T > c.NKV ? c.T / c.NKV : 1)
            << " copies of each)\n";
}

INSTANTIATE_TEST_SUITE_P(Shapes, MegatronSpDecodeGreedy, ::testing::ValuesIn(kCases), case_name);

// ---------------------------------------------------------------- traffic, determinism

class MegatronSpDecodeTraffic : public ::testing::TestWithParam<TpCase> {};

// The decoder's stages under the planner's names (decode_cost.cpp's megatron_sp entries).
std::vector<std::pair<std::string, const TrafficCounters*>> named_stages(
    const MegatronSpTraffic& t) {
  return {{"QKV input all-gather", &t.qkv_gather},    {"W_O reduce-scatter", &t.o_proj},
          {"MLP input all-gather", &t.mlp_gather},    {"MLP down reduce-scatter", &t.mlp},
          {"embedding reduce-scatter", &t.embedding}, {"LM head input all-gather", &t.head_gather},
          {"LM head logits all-gather", &t.lm_head}};
}

// The prefill (49 rows, padded) and every decode step (B = 5 rows, padded), on every rank: each
// stage equals the planner's megatron_sp_prefill_stage_traffic / decode_stage_traffic
// (megatron_sp(T)), the totals their sum (decode_step_traffic for a decode step), and each rank's
// KV bytes the planner's per-token bytes over B·max_context positions.
TEST_P(MegatronSpDecodeTraffic, PrefillAndEveryDecodeStepOnEveryRankEqualThePlannersClosedForms) {
  const TpCase c = GetParam();
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 11);
  const int B = static_cast<int>(prompts.size()), steps = 4;
  const DecodeShape s = shape_for(c, B, longest(prompts) + steps + 1);
  const auto w = ref::init_weights<float>(cfg, 29);
  const cost::ModelShape ms = cost::ModelShape::from(cfg, B, s.max_context);
  const cost::DecodeStrategy st = cost::DecodeStrategy::megatron_sp(c.T);
  std::vector<std::int64_t> lengths;
  for (const auto& p : prompts) lengths.push_back(static_cast<std::int64_t>(p.size()));
  std::vector<std::vector<std::string>> findings(static_cast<std::size_t>(c.T));
  std::vector<int> checked(static_cast<std::size_t>(c.T), 0);
  World world({.ranks = c.T});
  world.run([&](Rank& rank) {
    const int r = rank.id();
    auto& out = findings[static_cast<std::size_t>(r)];
    MegatronSpDecoder dec(rank, s, w);
    std::vector<float> logits = dec.prefill(prompts);
    {
      const auto want = cost::megatron_sp_prefill_stage_traffic(ms, c.T, lengths, sizeof(float), r);
      TrafficCounters total;
      for (const auto& stage : want) total += stage.traffic;
      const MegatronSpTraffic& got = dec.last_traffic();
      const auto f = testing::stage_findings("rank " + std::to_string(r) + " prefill",
                                             named_stages(got), got.total(), want, total);
      out.insert(out.end(), f.begin(), f.end());
    }
    ref::Sampler greedy = ref::Sampler::greedy();
    for (int step = 0; step < steps; ++step) {
      logits = dec.decode_step(greedy.sample(std::span<const float>(logits), B, cfg.vocab));
      const MegatronSpTraffic& got = dec.last_traffic();
      const std::string at = "rank " + std::to_string(r) + " step " + std::to_string(step);
      const auto f =
          testing::stage_findings(at, named_stages(got), got.total(),
                                  cost::decode_stage_traffic(ms, st, B, sizeof(float), r),
                                  cost::decode_step_traffic(ms, st, B, sizeof(float), r));
      out.insert(out.end(), f.begin(), f.end());
      ++checked[static_cast<std::size_t>(r)];
    }
    const std::uint64_t want_kv = planner_kv_bytes(cfg, B, s.max_context, c.T, sizeof(float));
    if (dec.kv_cache_bytes() != want_kv)
      out.push_back("rank " + std::to_string(r) + " kv_cache_bytes " +
                    std::to_string(dec.kv_cache_bytes()) + " vs planner " +
                    std::to_string(want_kv));
  });
  testing::expect_no_findings(findings, checked, steps);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MegatronSpDecodeTraffic, ::testing::ValuesIn(kCases), case_name);

TEST(MegatronSpDecoder, TwoRunsAreBitwiseIdentical) {
  const TpCase c = kCases[5];  // T=8 on NKV=2: duplicated KV heads
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 9);
  const DecodeShape s = shape_for(c, static_cast<int>(prompts.size()), longest(prompts) + 20);
  const auto w = ref::init_weights<float>(cfg, 17);
  const auto a = testing::run_decoder<float>(c.T, msp_factory(s, w), prompts, 16);
  const auto b = testing::run_decoder<float>(c.T, msp_factory(s, w), prompts, 16);
  testing::expect_bitwise_identical(a, b);
  testing::expect_every_rank_equal(a);
}

TEST(MegatronSpDecoder, ASequencesLogitsDoNotDependOnItsBatchMatesInDouble) {
  const TpCase c = kCases[4];  // T=4 on NKV=2
  const int steps = 24;
  const ref::ModelConfig cfg = testing::small_gqa_model(c.NH, c.NKV, c.hidden);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 3);
  const auto w = ref::init_weights<double>(cfg, 19);
  const std::int64_t max_context = longest(prompts) + steps + 1;
  testing::expect_batch_independent(prompts, {0, 2}, [&](const Prompts& p) {
    const DecodeShape s = shape_for(c, static_cast<int>(p.size()), max_context);
    return testing::run_decoder<double>(c.T, msp_factory(s, w), p, steps);
  });
}

}  // namespace
}  // namespace tspemu::tsp
