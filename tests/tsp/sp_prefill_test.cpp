// SP / context-parallel prefill by ring pass-KV and by Ulysses (sp_decoder.hpp's SpPrefill,
// tsp/sequence_prefill.hpp), feeding the pass-Q decode: the cache each rank is left with against
// the oracle's, the first token's logits under the project's rule, 256-step greedy runs, and the
// prefill's traffic against plan/decode_cost.hpp's sp_prefill_stage_traffic on every rank.
//
// Shapes: sp_decoder_test.cpp's model (NH=8, NKV=4, C=64, L=2, F=V=96) at Σ = 2, 3, 4, 8 for the
// ring; Ulysses needs Σ | NH and Σ | NKV, so Σ = 2, 4 on it and Σ = 8 on NH=16, NKV=8 (Σ = 3 and
// Σ = 8 on NKV=4 are refused, tested). Prompts of lengths 1 (ranks without a token of it), 7 and
// 13 (prime: contiguous blocks, unequal counts, Ulysses' padded slots), 12 and 16 (zigzag where
// 2Σ divides them); interleave as sp_decoder_test.cpp.
// Bounds:
//   - double cache: every layer within 1e-13 of the largest magnitude (kMeshCacheRtol, the
//     argument of tests/reference/decode_test.cpp's kCachedRtol), as tspm_decoder_test.cpp's:
//     layer 0's K/V of a token is one dot product over C of the same operands at the same RoPE
//     position as the reference's, but a rank computes only its own rows, a row subset of the
//     reference's per-sequence GEMM, and OpenBLAS rounds a row by the call's row count (its edge
//     tiles), so layer 0 differs by an ulp where pass-Q (all rows on every rank) is bitwise;
//     later layers' residual carries attention whose softmax sums are split over key blocks and
//     merged by log-sum-exp (ring) or run in one call per head shard (Ulysses). Held positions
//     exactly KvOwnership's.
//   - float logits of the prefill and a few teacher-forced steps: err(SP fp32) <= 3·err(reference
//     fp32) + tiny against the oracle.
//   - double greedy tokens equal to the reference's for 256 steps.
//   - traffic: == (integers), stage by stage.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode_test_support.hpp"
#include "mesh_decode_checks.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/kv_ownership.hpp"
#include "tspemu/tsp/sp_decoder.hpp"
#include "tspw_test_model.hpp"

namespace tspemu::tsp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::longest;
using testing::Prompts;
using ::testing::ThrowsMessage;

constexpr int kPrefillForcedSteps = 4;

struct PrefillCase {
  SpPrefill prefill;
  int S, NH, NKV;
};

std::string prefill_case_name(const ::testing::TestParamInfo<PrefillCase>& i) {
  return std::string(i.param.prefill == SpPrefill::ring ? "Ring" : "Ulysses") + "_S" +
         std::to_string(i.param.S) + "_NH" + std::to_string(i.param.NH) + "_NKV" +
         std::to_string(i.param.NKV);
}

const PrefillCase kPrefillCases[] = {{SpPrefill::ring, 2, 8, 4},    {SpPrefill::ring, 3, 8, 4},
                                     {SpPrefill::ring, 4, 8, 4},    {SpPrefill::ring, 8, 8, 4},
                                     {SpPrefill::ulysses, 2, 8, 4}, {SpPrefill::ulysses, 4, 8, 4},
                                     {SpPrefill::ulysses, 8, 16, 8}};

ref::ModelConfig prefill_model(const PrefillCase& c) {
  return testing::small_gqa_model(c.NH, c.NKV, 64);
}

DecodeShape shape_of(const PrefillCase& c, int B, std::int64_t max_context) {
  return DecodeShape{.model = prefill_model(c),
                     .D = c.S,
                     .batch = B,
                     .max_context = max_context,
                     .interleave = c.S == 3 ? 3 : (c.S == 8 ? 2 : 1)};
}

template <class T>
auto factory(const DecodeShape& s, const ref::ModelWeights<T>& w, SpPrefill p) {
  return [&s, &w, p](Rank& rank) { return std::make_unique<BasicSpDecoder<T>>(rank, s, w, p); };
}

std::string prefill_label(const PrefillCase& c) {
  return std::string("SP Σ=") + std::to_string(c.S) + " " + cost::sp_prefill_name(c.prefill) +
         " prefill";
}

// ---------------------------------------------------------------- shapes

TEST(SpPrefillShape, UlyssesRefusesSigmaNotDividingTheHeadsNamingSigmaNhAndNkv) {
  for (const int S : {3, 8}) {
    const DecodeShape s = shape_of({SpPrefill::ulysses, S, 8, 4}, 2, 8);
    EXPECT_THAT([&] { validate_sp_prefill(s, SpPrefill::ulysses); },
                ThrowsMessage<std::invalid_argument>(AllOf(
                    HasSubstr("SP decode"), HasSubstr("Ulysses prefill"),
                    HasSubstr("Σ=" + std::to_string(S)), HasSubstr("NH=8"), HasSubstr("NKV=4"))));
    EXPECT_NO_THROW(validate_sp_prefill(s, SpPrefill::ring));
    EXPECT_NO_THROW(validate_sp(s));
    const auto w = ref::init_weights<float>(s.model, 1);
    World world({.ranks = S});
    EXPECT_THROW(world.run([&](Rank& r) { SpDecoder dec(r, s, w, SpPrefill::ulysses); }),
                 std::exception);
  }
}

TEST(SpPrefillShape, RingAndUlyssesRunOnSpOnlyNotOnATpSpMesh) {
  MeshDecodeShape m{.model = testing::small_gqa_model(8, 4, 64),
                    .T = 2,
                    .Sp = 2,
                    .batch = 1,
                    .max_context = 8,
                    .interleave = 1,
                    .prefill = SpPrefill::ring};
  EXPECT_THAT([&] { m.validate(); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("TP+SP decode"), HasSubstr("ring pass-KV"), HasSubstr("T=2"))));
  m.prefill = SpPrefill::pass_q;
  EXPECT_NO_THROW(m.validate());
}

TEST(SpPrefill, BadInputIsRefusedNamingSequencePositionAndValue) {
  for (const SpPrefill p : {SpPrefill::ring, SpPrefill::ulysses}) {
    const DecodeShape s = shape_of({p, 2, 8, 4}, 2, 8);
    const auto w = ref::init_weights<float>(s.model, 2);
    World world({.ranks = 2});
    world.run([&](Rank& r) {
      SpDecoder dec(r, s, w, p);
      testing::expect_bad_input_refused(dec, "SP decode");
    });
  }
}

// ---------------------------------------------------------------- cache and first logits

class SpPrefillCache : public ::testing::TestWithParam<PrefillCase> {};

// Double: after the prefill and two greedy steps, every rank's cache (the prompt's positions it
// owns, and the generated ones) against the oracle's, the tokens against the oracle's, every
// rank's logits bitwise rank 0's.
TEST_P(SpPrefillCache, EveryRanksCacheEqualsTheOraclesAfterThePrefill) {
  const PrefillCase c = GetParam();
  const ref::ModelConfig cfg = prefill_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 5);
  const int steps = 2;
  const DecodeShape s = shape_of(c, static_cast<int>(prompts.size()), longest(prompts) + steps + 1);
  const auto w = ref::init_weights<double>(cfg, 11);
  std::mutex m;
  std::vector<std::string> errors;
  double worst_all = 0;
  auto inspect = [&](Rank& rank, const auto& dec, const ref::Generation<double>& oracle) {
    double worst = 0;
    const auto e = testing::cache_mismatches(rank.id(), dec.cache(), 0, oracle.cache,
                                             testing::max_magnitude(oracle.cache),
                                             testing::kMeshCacheRtol, worst,
                                             /*layer0_exact=*/false);
    const std::lock_guard lock(m);
    errors.insert(errors.end(), e.begin(), e.end());
    worst_all = std::max(worst_all, worst);
  };
  const auto g =
      testing::run_greedy(c.S, w, prompts, s.max_context, steps, factory(s, w, c.prefill), inspect);
  ASSERT_NO_FATAL_FAILURE(testing::expect_greedy_equals_oracle(prefill_label(c), g, steps));
  for (const std::string& e : errors) ADD_FAILURE() << prefill_label(c) << ": " << e;
  std::cout << prefill_label(c) << ": KV cache, all layers, worst |decoder - reference| / max "
            << worst_all << "\n";
}

INSTANTIATE_TEST_SUITE_P(Variants, SpPrefillCache, ::testing::ValuesIn(kPrefillCases),
                         prefill_case_name);

class SpPrefillFloat : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(SpPrefillFloat, FirstTokensLogitsAndTeacherForcedStepsPassTheOracleRule) {
  const PrefillCase c = GetParam();
  const ref::ModelConfig cfg = prefill_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 5);
  const DecodeShape s =
      shape_of(c, static_cast<int>(prompts.size()), longest(prompts) + kPrefillForcedSteps + 1);
  const auto w64 = ref::init_weights<double>(cfg, 11);
  const auto w32 = ref::init_weights<float>(cfg, 11);
  const auto r =
      testing::judge_teacher_forced(prefill_label(c), c.S, w64, w32, prompts, s.max_context,
                                    kPrefillForcedSteps, factory(s, w32, c.prefill));
  std::cout << prefill_label(c) << ": worst err(SP fp32)/err(reference fp32) over " << r.steps
            << " logits " << r.worst_ratio << "\n";
}

INSTANTIATE_TEST_SUITE_P(Variants, SpPrefillFloat, ::testing::ValuesIn(kPrefillCases),
                         prefill_case_name);

// ---------------------------------------------------------------- traffic

class SpPrefillTraffic : public ::testing::TestWithParam<PrefillCase> {};

// The prefill's stages on every rank equal sp_prefill_stage_traffic's (the ring's from the
// ownership map's prompt counts per rank); the decode steps after it equal the pass-Q planner's
// (mesh_decode_checks.hpp's check).
TEST_P(SpPrefillTraffic, PrefillStagesOnEveryRankEqualThePlannersClosedForm) {
  const PrefillCase c = GetParam();
  const ref::ModelConfig cfg = prefill_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 11);
  const int B = static_cast<int>(prompts.size());
  const DecodeShape s = shape_of(c, B, longest(prompts) + 3);
  const auto w = ref::init_weights<float>(cfg, 29);
  const std::vector<std::int64_t> lengths = testing::lengths_of(prompts);
  const KvOwnership own(c.S, s.interleave, lengths);
  std::vector<std::int64_t> per_rank(static_cast<std::size_t>(c.S), 0);
  for (int r = 0; r < c.S; ++r)
    for (int b = 0; b < B; ++b)
      per_rank[static_cast<std::size_t>(r)] +=
          own.count(r, b, lengths[static_cast<std::size_t>(b)]);
  const cost::ModelShape ms = cost::ModelShape::from(cfg, B, s.max_context);
  std::vector<std::vector<std::string>> findings(static_cast<std::size_t>(c.S));
  std::vector<int> checked(static_cast<std::size_t>(c.S), 0);
  World world({.ranks = c.S});
  world.run([&](Rank& rank) {
    const int r = rank.id();
    SpDecoder dec(rank, s, w, c.prefill);
    (void)dec.prefill(prompts);
    const MeshTraffic& got = dec.last_traffic();
    const auto want =
        cost::sp_prefill_stage_traffic(ms, c.S, c.prefill, lengths, per_rank, sizeof(float), r);
    TrafficCounters want_total;
    for (const auto& stage : want) want_total += stage.traffic;
    const std::vector<std::pair<std::string, const TrafficCounters*>> mine{
        {c.prefill == SpPrefill::ring ? "K/V ring" : "sequence-heads all-to-all",
         c.prefill == SpPrefill::ring ? &got.kv_ring : &got.heads_exchange},
        {"last rows all-reduce", &got.last_rows}};
    auto& out = findings[static_cast<std::size_t>(r)];
    const auto f = testing::stage_findings(prefill_label(c) + " rank " + std::to_string(r), mine,
                                           got.total(), want, want_total);
    out.insert(out.end(), f.begin(), f.end());
    ++checked[static_cast<std::size_t>(r)];
  });
  testing::expect_no_findings(findings, checked, 1);
  testing::expect_traffic_equals_planner(sp_mesh_shape(s, c.prefill), prompts, 3,
                                         factory(s, w, c.prefill));
}

INSTANTIATE_TEST_SUITE_P(Variants, SpPrefillTraffic, ::testing::ValuesIn(kPrefillCases),
                         prefill_case_name);

// The pass-Q prefill's traffic equals its closed form too (every rank computes every token).
TEST(SpPrefillTraffic, PassQPrefillEqualsThePlannersClosedForm) {
  const PrefillCase c{SpPrefill::pass_q, 4, 8, 4};
  const ref::ModelConfig cfg = prefill_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 11);
  const int B = static_cast<int>(prompts.size());
  const DecodeShape s = shape_of(c, B, longest(prompts) + 1);
  const auto w = ref::init_weights<float>(cfg, 29);
  const cost::ModelShape ms = cost::ModelShape::from(cfg, B, s.max_context);
  std::vector<std::vector<std::string>> findings(4);
  std::vector<int> checked(4, 0);
  World world({.ranks = 4});
  world.run([&](Rank& rank) {
    SpDecoder dec(rank, s, w);
    (void)dec.prefill(prompts);
    const MeshTraffic& got = dec.last_traffic();
    const auto want = cost::sp_prefill_stage_traffic(
        ms, 4, SpPrefill::pass_q, testing::lengths_of(prompts), {}, sizeof(float), rank.id());
    TrafficCounters want_total;
    for (const auto& stage : want) want_total += stage.traffic;
    const auto f = testing::stage_findings(
        "pass-Q rank " + std::to_string(rank.id()),
        {{"LSE all-gather", &got.lse_gather}, {"attention output all-reduce", &got.output_reduce}},
        got.total(), want, want_total);
    auto& out = findings[static_cast<std::size_t>(rank.id())];
    out.insert(out.end(), f.begin(), f.end());
    ++checked[static_cast<std::size_t>(rank.id())];
  });
  testing::expect_no_findings(findings, checked, 1);
}

// ---------------------------------------------------------------- double, free-running greedy

class SpPrefillGreedy : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(SpPrefillGreedy, DoubleRunOf256StepsEqualsTheReferenceOnEveryRank) {
  const PrefillCase c = GetParam();
  const ref::ModelConfig cfg = prefill_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 7);
  const DecodeShape s =
      shape_of(c, static_cast<int>(prompts.size()), longest(prompts) + testing::kGreedySteps + 3);
  const auto w = ref::init_weights<double>(cfg, 13);
  testing::expect_greedy_run_matches(sp_mesh_shape(s, c.prefill), w, prompts,
                                     factory(s, w, c.prefill), /*layer0_exact=*/false);
}

INSTANTIATE_TEST_SUITE_P(Variants, SpPrefillGreedy, ::testing::ValuesIn(kPrefillCases),
                         prefill_case_name);

}  // namespace
}  // namespace tspemu::tsp
