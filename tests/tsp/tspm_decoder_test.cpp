// TSP-M decoding (tspm_decoder.hpp) against the reference decoder (reference/decode.hpp), the fp64
// oracle (the double reference) and the planner's closed forms (plan/decode_cost.hpp).
//
// Shapes: TSP-W's test models (tspw_test_model.hpp: GQA g = 2, L = 2, F = V = 96, D | NH, NKV, F,
// V) at D = 2, 3, 4, 8; five prompts of lengths 1 (shorter than D: ranks without a key of it, and
// without a token of it to own), 7 and 13 (prime), 12 and 16 (zigzag where 2D divides them, blocks
// elsewhere). Interleave I = 1, 3 (D=3), 2 (D=8), as TSP-W's tests.
//
// Bounds:
//   - float logits per step: the project's rule (reference/numerics.hpp), teacher-forced on the
//     oracle's greedy tokens: err(TSP-M fp32) <= 3·err(reference fp32) + tiny against the double
//     reference (decode_test_support.hpp's judge).
//   - double greedy tokens: equal to the double reference's for 256 steps.
//   - double KV cache: every position held by the rank KvOwnership names, and its K and V within
//     kCacheRtol of the largest magnitude of the oracle's cache: layer 0's rows are one dot product
//     over C of the same operands as the reference's (a row shard of its GEMM), later layers see a
//     residual whose o_proj and down sums are split into D shard products added in order (the
//     argument of tspw_decoder_test.cpp's bound, the same 1e-13).
//   - traffic and KV bytes: integers, compared with == against the planner.
#include "tspemu/tsp/tspm_decoder.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
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
#include "tspw_test_model.hpp"

namespace tspemu::tsp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::kCacheRtol;
using testing::kForcedSteps;
using testing::kGreedySteps;
using testing::longest;
using testing::Prompts;
using ::testing::ThrowsMessage;

DecodeShape tspm_shape(int D, int B, std::int64_t max_context) {
  return DecodeShape{.model = testing::tspw_test_model(D),
                     .D = D,
                     .batch = B,
                     .max_context = max_context,
                     .interleave = D == 3 ? 3 : (D == 8 ? 2 : 1)};
}

template <class T>
auto tspm_factory(const DecodeShape& s, const ref::ModelWeights<T>& w) {
  return [&s, &w](Rank& rank) { return std::make_unique<BasicTspmDecoder<T>>(rank, s, w); };
}

// ---------------------------------------------------------------- refusals

TEST(TspmDecodeShape, RefusesDNotDividingKvHeadsNamingTspmDAndNkv) {
  DecodeShape s = tspm_shape(4, 1, 8);
  s.D = 8;
  World world({.ranks = 8});
  const auto w = ref::init_weights<float>(s.model, 1);
  EXPECT_THAT(
      [&] { world.run([&](Rank& r) { TspmDecoder dec(r, s, w); }); },
      ThrowsMessage<std::exception>(AllOf(HasSubstr("TSP-M decode: D=8"), HasSubstr("NKV=4"))));
  s = tspm_shape(4, 1, 8);
  World three({.ranks = 3});
  EXPECT_THAT([&] { three.run([&](Rank& r) { TspmDecoder dec(r, s, w); }); },
              ThrowsMessage<std::exception>(HasSubstr("world has 3 ranks but D=4")));
}

TEST(TspmDecoder, BadInputIsRefusedNamingSequencePositionAndValue) {
  const DecodeShape s = tspm_shape(2, 2, 8);
  const auto w = ref::init_weights<float>(s.model, 2);
  testing::expect_decoder_refuses_bad_input(2, tspm_factory(s, w), "TSP-M decode");
}

// ---------------------------------------------------------------- float, teacher-forced

class TspmFloat : public ::testing::TestWithParam<int> {};

TEST_P(TspmFloat, LogitsOfEveryStepTeacherForcedPassTheOracleRule) {
  const int D = GetParam();
  const ref::ModelConfig cfg = testing::tspw_test_model(D);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 5);
  const DecodeShape s =
      tspm_shape(D, static_cast<int>(prompts.size()), longest(prompts) + kForcedSteps + 1);
  const auto w64 = ref::init_weights<double>(cfg, 11);
  const auto w32 = ref::init_weights<float>(cfg, 11);
  const testing::ForcedResult r =
      testing::judge_teacher_forced("TSP-M D=" + std::to_string(D), D, w64, w32, prompts,
                                    s.max_context, kForcedSteps, tspm_factory(s, w32));
  std::cout << "TSP-M D=" << D << ": worst err(TSP-M fp32)/err(reference fp32) over " << r.steps
            << " steps " << r.worst_ratio << "\n";
}

INSTANTIATE_TEST_SUITE_P(D, TspmFloat, ::testing::Values(2, 3, 4, 8));

// ---------------------------------------------------------------- double, free-running greedy

// One line per position where `kv` (rank `rank`'s cache) disagrees with the oracle's: a position
// not held where KvOwnership puts it, or K/V beyond kCacheRtol · max_mag.
std::vector<std::string> cache_errors(int rank, const RankKvCache<double>& kv,
                                      const ref::KvCache<double>& want) {
  double max_mag = 0;
  for (int l = 0; l < want.n_layers(); ++l)
    for (int b = 0; b < want.batch(); ++b)
      for (std::int64_t p = 0; p < want.length(b); ++p)
        for (const double x : want.k(l, b, p)) max_mag = std::max(max_mag, std::abs(x));
  std::vector<std::string> errors;
  for (int l = 0; l < want.n_layers(); ++l)
    for (int b = 0; b < want.batch(); ++b) {
      const std::vector<std::int64_t> mine = kv.ownership().owned(rank, b, want.length(b));
      const auto held = kv.positions(l, b);
      const std::string at =
          "rank " + std::to_string(rank) + " layer " + std::to_string(l) + " sequence ";
      if (!std::equal(held.begin(), held.end(), mine.begin(), mine.end())) {
        errors.push_back(at + std::to_string(b) + ": positions held are not the ownership's");
        continue;
      }
      for (const std::int64_t p : mine) {
        const auto k = kv.k(l, b, p), v = kv.v(l, b, p), wk = want.k(l, b, p), wv = want.v(l, b, p);
        for (std::size_t i = 0; i < k.size(); ++i)
          if (std::abs(k[i] - wk[i]) > kCacheRtol * max_mag ||
              std::abs(v[i] - wv[i]) > kCacheRtol * max_mag) {
            errors.push_back(at + std::to_string(b) + " position " + std::to_string(p) +
                             ": K/V element " + std::to_string(i) + " differs from the oracle's");
            break;
          }
      }
    }
  return errors;
}

class TspmGreedy : public ::testing::TestWithParam<int> {};

// One double run of 256 free-running greedy steps per D: the tokens equal the reference's, every
// rank's logits equal rank 0's bit for bit, every rank's cache holds the oracle's K/V where
// KvOwnership says, and kv_cache_bytes is the TSP-W closed form (the planner's bytes per token and
// layer over the rank's reserved positions) and the arena's charge.
TEST_P(TspmGreedy, DoubleRunOf256StepsEqualsTheReferenceOnEveryRank) {
  const int D = GetParam();
  const ref::ModelConfig cfg = testing::tspw_test_model(D);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 7);
  const int B = static_cast<int>(prompts.size());
  const DecodeShape s = tspm_shape(D, B, longest(prompts) + kGreedySteps + 3);
  const auto w = ref::init_weights<double>(cfg, 13);
  std::mutex m;
  std::vector<std::string> errors;
  const auto start = std::chrono::steady_clock::now();
  const auto g = testing::run_greedy(
      D, w, prompts, s.max_context, kGreedySteps, tspm_factory(s, w),
      [&](Rank& rank, const BasicTspmDecoder<double>& dec, const ref::Generation<double>& oracle) {
        const auto e = cache_errors(rank.id(), dec.cache(), oracle.cache);
        const std::lock_guard lock(m);
        errors.insert(errors.end(), e.begin(), e.end());
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_NO_FATAL_FAILURE(
      testing::expect_greedy_equals_oracle("TSP-M D=" + std::to_string(D), g, kGreedySteps));
  for (const std::string& e : errors) ADD_FAILURE() << e;
  const cost::ModelShape ms = cost::ModelShape::from(cfg, B, s.max_context);
  std::vector<std::int64_t> lengths;
  for (const auto& p : prompts) lengths.push_back(static_cast<std::int64_t>(p.size()));
  const KvOwnership own(D, s.interleave, lengths);
  for (int r = 0; r < D; ++r) {
    std::uint64_t tokens = 0;
    for (int b = 0; b < B; ++b)
      tokens += static_cast<std::uint64_t>(own.count(r, b, s.max_context));
    const std::uint64_t raw =
        static_cast<std::uint64_t>(cfg.n_layers) * tokens *
        cost::kv_bytes_per_token_layer(ms, cost::DecodeStrategy::tsp_w(D), sizeof(double));
    const std::uint64_t want = (raw + 63) / 64 * 64;  // the arena's granularity
    EXPECT_EQ(g.runs[static_cast<std::size_t>(r)].kv_cache_bytes, want) << "rank " << r;
    EXPECT_EQ(g.runs[static_cast<std::size_t>(r)].arena_kv_cache, want) << "rank " << r;
  }
  std::cout << "TSP-M D=" << D << ": 256 greedy double steps (and the oracle's) in " << seconds
            << " s\n";
}

INSTANTIATE_TEST_SUITE_P(D, TspmGreedy, ::testing::Values(2, 3, 4, 8));

// ---------------------------------------------------------------- determinism, independence

TEST(TspmDecoder, TwoRunsAreBitwiseIdentical) {
  const int D = 3;
  const ref::ModelConfig cfg = testing::tspw_test_model(D);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 9);
  const DecodeShape s = tspm_shape(D, static_cast<int>(prompts.size()), longest(prompts) + 20);
  const auto w = ref::init_weights<float>(cfg, 17);
  testing::expect_deterministic(D, tspm_factory(s, w), prompts, 16);
}

TEST(TspmDecoder, ASequencesLogitsDoNotDependOnItsBatchMatesInDouble) {
  const int D = 4, steps = 24;
  const ref::ModelConfig cfg = testing::tspw_test_model(D);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 3);
  const auto w = ref::init_weights<double>(cfg, 19);
  const std::int64_t max_context = longest(prompts) + steps + 1;
  testing::expect_batch_independent(prompts, {0, 2}, [&](const Prompts& p) {
    const DecodeShape s = tspm_shape(D, static_cast<int>(p.size()), max_context);
    return testing::run_decoder<double>(D, tspm_factory(s, w), p, steps);
  });
}

// ---------------------------------------------------------------- traffic vs the planner

void expect_stages_equal(const std::string& at, const TspmTraffic& got,
                         const cost::TspmStageTraffic& want) {
  EXPECT_EQ(got.embedding, want.embedding) << at << " embedding";
  EXPECT_EQ(got.attention_shards, want.attention_shards) << at << " attention_shards";
  EXPECT_EQ(got.q_gather, want.q_gather) << at << " q_gather";
  EXPECT_EQ(got.partials, want.partials) << at << " partials";
  EXPECT_EQ(got.mlp_shards, want.mlp_shards) << at << " mlp_shards";
  EXPECT_EQ(got.lm_head, want.lm_head) << at << " lm_head";
  EXPECT_EQ(got.logits, want.logits) << at << " logits";
}

class TspmTrafficModel : public ::testing::TestWithParam<int> {};

// Every stage of the prefill and of five decode steps (the new tokens' owners move between ranks),
// on every rank, equals tspm_step_stage_traffic for the step's owners (float: the LSE's 4 bytes).
TEST_P(TspmTrafficModel, EveryStageOfEveryStepOnEveryRankEqualsThePlannersClosedForm) {
  const int D = GetParam(), steps = 5;
  const ref::ModelConfig cfg = testing::tspw_test_model(D);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 11);
  const int B = static_cast<int>(prompts.size());
  const DecodeShape s = tspm_shape(D, B, longest(prompts) + steps);
  const auto w = ref::init_weights<float>(cfg, 29);
  const cost::ModelShape m = cost::ModelShape::from(cfg, B, s.max_context);
  World world({.ranks = D});
  world.run([&](Rank& rank) {
    const int r = rank.id();
    BasicTspmDecoder<float> dec(rank, s, w);
    std::vector<float> logits = dec.prefill(prompts);
    const KvOwnership& own = dec.cache().ownership();
    std::vector<int> prompt_owners, last_owners;
    for (int b = 0; b < B; ++b) {
      const auto len = static_cast<std::int64_t>(prompts[static_cast<std::size_t>(b)].size());
      for (std::int64_t p = 0; p < len; ++p) prompt_owners.push_back(own.owner(b, p));
      last_owners.push_back(own.owner(b, len - 1));
    }
    expect_stages_equal(
        "rank " + std::to_string(r) + " prefill", dec.last_traffic(),
        cost::tspm_step_stage_traffic(m, D, prompt_owners, last_owners, sizeof(float), r));
    ref::Sampler greedy = ref::Sampler::greedy();
    for (int step = 0; step < steps; ++step) {
      std::vector<int> owners(static_cast<std::size_t>(B));
      for (int b = 0; b < B; ++b) owners[static_cast<std::size_t>(b)] = own.owner(b, dec.length(b));
      logits = dec.decode_step(greedy.sample(std::span<const float>(logits), B, cfg.vocab));
      expect_stages_equal("rank " + std::to_string(r) + " step " + std::to_string(step),
                          dec.last_traffic(),
                          cost::tspm_decode_stage_traffic(m, D, owners, sizeof(float), r));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(D, TspmTrafficModel, ::testing::Values(2, 3, 4, 8));

// The runtime counting sums to the planner's ring convention: over the ranks, the bytes sent in a
// decode step are D × decode_cost's per-device bytes for TSP-M (layers, LSE, vocabulary), for
// owner patterns with ranks owning none, and received equals sent.
TEST(TspmTrafficModel, RuntimeCountsSumToTheRingConvention) {
  for (const int D : {2, 4}) {
    const cost::ModelShape m = cost::ModelShape::from(testing::tspw_test_model(D), 3, 16);
    for (const std::vector<int>& owners :
         std::vector<std::vector<int>>{{0, 0, 0}, {0, 1, 1}, {D - 1, 0, D - 1}}) {
      TrafficCounters sum;
      for (int r = 0; r < D; ++r)
        sum += cost::tspm_decode_stage_traffic(m, D, owners, 4, r).total();
      const cost::DecodeCost c = cost::decode_cost(m, cost::DecodeStrategy::tsp_m(D),
                                                   std::vector<std::int64_t>(owners.size(), 5), 4);
      const double ring = c.comm_per_step() + c.lse_per_step() + c.vocab_per_step();
      EXPECT_DOUBLE_EQ(static_cast<double>(sum.total_sent()), D * ring) << "D=" << D;
      EXPECT_EQ(sum.total_sent(), sum.total_received()) << "D=" << D;
    }
  }
  const cost::ModelShape m = cost::ModelShape::from(testing::tspw_test_model(2), 1, 4);
  EXPECT_THAT([&] { cost::tspm_decode_stage_traffic(m, 2, {2}, 4, 0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("owner rank 2")));
  EXPECT_THAT([&] { cost::tspm_decode_stage_traffic(m, 2, {0}, 4, 2); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("rank 2 is not in [0, D)")));
}

}  // namespace
}  // namespace tspemu::tsp
