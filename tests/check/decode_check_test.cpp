// The check kit's decode entry (check/decode_check.hpp): the reference decoder wrapped as a 1-rank
// and as a replicated 3-rank schedule passes, TSP-W (tsp/tspw_decoder.hpp) passes at D = 2 and 4;
// planted faults fail naming the tensor, step, sequence, rank, layer and position (logits moved on
// one rank at one step, another token picked, TSP-W's TspwFault cases, a schedule that throws);
// near_tie() tells a rounding tie from a bug; bad input is an error, not a verdict. The double
// entry (check_decode_double): TSP-W in double passes at D = 2 and 4 within 1e-13 of the oracle
// with an exact free run; RoPE at local positions, a logit moved by 1e-9 (below float's
// resolution) and a changed pick each fail, named.
//
// Shapes: tests/tsp's TSP-W models (GQA 8/4 heads, L = 2, F = V = 96; NH = 6, NKV = 3 at D = 3),
// prompts of lengths 1 (shorter than D: ranks with no key of it), 7, 13 and 12.
#include "tspemu/check/decode_check.hpp"
#include "tspemu/check/row_decoder.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "../tsp/tspw_test_model.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/tsp/tspw_decoder.hpp"

namespace tspemu::check {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Changes a rank's logits [B, V] after step `step` (0: the prefill).
using Tamper = std::function<void(int rank, int step, std::vector<float>& logits)>;

// The reference decoder (reference/decode.hpp) on every rank: a replicated "schedule".
class ReferenceDecoder : public RankDecoder {
 public:
  ReferenceDecoder(DecodeRank& dr, Tamper tamper)
      : w_(dr.master()),
        max_context_(dr.max_context()),
        rank_(dr.rank().id()),
        tamper_(std::move(tamper)) {}
  std::vector<float> prefill(const Prompts& prompts) override {
    auto p = ref::prefill(w_, prompts, max_context_);
    cache_ = std::move(p.cache);
    step_ = 0;
    return tampered(std::move(p.logits));
  }
  std::vector<float> decode_step(std::span<const std::int32_t> tokens) override {
    ++step_;
    return tampered(ref::decode_step(w_, *cache_, tokens));
  }
  bool cache_entry(int layer, int seq, std::int64_t pos, std::span<float> k,
                   std::span<float> v) const override {
    if (pos >= cache_->length(layer, seq)) return false;
    const auto kr = cache_->k(layer, seq, pos), vr = cache_->v(layer, seq, pos);
    std::copy(kr.begin(), kr.end(), k.begin());
    std::copy(vr.begin(), vr.end(), v.begin());
    return true;
  }

 private:
  std::vector<float> tampered(std::vector<float> logits) {
    if (tamper_) tamper_(rank_, step_, logits);
    return logits;
  }
  const ref::ModelWeights<float>& w_;
  std::int64_t max_context_;
  int rank_, step_ = 0;
  Tamper tamper_;
  std::optional<ref::KvCache<float>> cache_;
};

// TSP-W as a user's schedule, in float or double: its cache is a tsp::RankKvCache, which the kit
// reads itself. tamper, when set, changes a rank's logits after a step as Tamper does.
template <class T>
class BasicTspw : public BasicRankDecoder<T> {
 public:
  using Tampering = std::function<void(int rank, int step, std::vector<T>& logits)>;
  BasicTspw(BasicDecodeRank<T>& dr, tsp::TspwFault fault, Tampering tamper = {})
      : dec_(dr.rank(), shape(dr), dr.master(), fault),
        rank_(dr.rank().id()),
        tamper_(std::move(tamper)) {}
  std::vector<T> prefill(const Prompts& prompts) override {
    step_ = 0;
    return tampered(dec_.prefill(prompts));
  }
  std::vector<T> decode_step(std::span<const std::int32_t> tokens) override {
    ++step_;
    return tampered(dec_.decode_step(tokens));
  }
  const tsp::RankKvCache<T>* kv_cache() const override { return &dec_.cache(); }

 private:
  static tsp::DecodeShape shape(BasicDecodeRank<T>& dr) {
    tsp::DecodeShape s;
    s.model = dr.config();
    s.D = dr.rank().size();
    s.batch = dr.batch();
    s.max_context = dr.max_context();
    return s;
  }
  std::vector<T> tampered(std::vector<T> logits) {
    if (tamper_) tamper_(rank_, step_, logits);
    return logits;
  }
  tsp::BasicTspwDecoder<T> dec_;
  int rank_, step_ = 0;
  Tampering tamper_;
};
using Tspw = BasicTspw<float>;

DecoderFactory reference_factory(const Tamper& tamper = {}) {
  return [tamper](DecodeRank& dr) { return std::make_unique<ReferenceDecoder>(dr, tamper); };
}

DecoderFactory tspw_factory(tsp::TspwFault fault = tsp::TspwFault::none) {
  return [fault](DecodeRank& dr) { return std::make_unique<Tspw>(dr, fault); };
}

DecoderFactory64 tspw64_factory(tsp::TspwFault fault = tsp::TspwFault::none,
                                const BasicTspw<double>::Tampering& tamper = {}) {
  return [fault, tamper](DecodeRank64& dr) {
    return std::make_unique<BasicTspw<double>>(dr, fault, tamper);
  };
}

DecodeCheck decode_check(int D, int steps, int free_run_steps = 0) {
  DecodeCheck c;
  c.name = "test";
  c.model = tsp::testing::tspw_test_model(D);
  c.ranks = D;
  c.prompts = seeded_prompts(c.model.vocab, {1, 7, 13, 12}, 5);
  c.steps = steps;
  c.free_run_steps = free_run_steps;
  c.seed = 11;
  return c;
}

std::string printed(const DecodeReport& r) {
  std::ostringstream s;
  r.print(s);
  return s.str();
}

TEST(DecodeCheck, TheReferenceOnOneRankPassesEveryCheck) {
  const DecodeCheck c = decode_check(1, 6, 12);
  const DecodeReport r = check_decode(c, reference_factory());
  EXPECT_TRUE(r.ok()) << printed(r);
  EXPECT_EQ(r.rows_judged, (c.steps + 1) * 4);
  ASSERT_EQ(r.cache.size(), 2u * static_cast<std::size_t>(c.model.n_layers));
  for (const std::string& line : r.cache) EXPECT_THAT(line, HasSubstr("ok   cache"));
  EXPECT_THAT(printed(r), HasSubstr("verdict: PASS"));
}

TEST(DecodeCheck, TheReferenceReplicatedOnThreeRanksPasses) {
  const DecodeReport r = check_decode(decode_check(3, 5, 8), reference_factory());
  EXPECT_TRUE(r.ok()) << printed(r);
  EXPECT_EQ(r.rows_judged, 6 * 4 * 3);
}

class DecodeCheckTspw : public ::testing::TestWithParam<int> {};

TEST_P(DecodeCheckTspw, TspwPassesLogitsCacheAndAFreeRun) {
  const DecodeReport r = check_decode(decode_check(GetParam(), 8, 24), tspw_factory());
  std::cout << printed(r);
  EXPECT_TRUE(r.ok()) << printed(r);
  EXPECT_EQ(r.rows_judged, 9 * 4 * GetParam());
  EXPECT_EQ(r.cache.size(), 4u);
}

INSTANTIATE_TEST_SUITE_P(D, DecodeCheckTspw, ::testing::Values(2, 4));

// A failed report with "cache K" failures, each naming layer, sequence, position and rank.
void expect_cache_k_failures_named(const DecodeReport& r) {
  ASSERT_FALSE(r.ok());
  const auto keys = r.find("cache K");
  ASSERT_FALSE(keys.empty()) << printed(r);
  for (const DecodeFailure* f : keys) {
    EXPECT_GE(f->layer, 0);
    EXPECT_GE(f->sequence, 0);
    EXPECT_GE(f->position, 0);
    EXPECT_GE(f->rank, 0);
  }
}

// A failed report whose "logits" failures are the two of a tamper of vocabulary id 5 of sequence
// 1 on rank 1 at step 2: the rule and the bitwise comparison with rank 0.
void expect_logits_failures_at_step_2_sequence_1_rank_1_id_5(const DecodeReport& r) {
  ASSERT_FALSE(r.ok());
  const auto logits = r.find("logits");
  ASSERT_EQ(logits.size(), 2u) << printed(r);
  for (const DecodeFailure* f : logits) {
    EXPECT_EQ(f->where(), "step 2 sequence 1 rank 1");
    EXPECT_THAT(f->detail, HasSubstr("vocabulary id 5"));
  }
}

// ---- the double entry (check_decode_double)

class DecodeCheckDouble : public ::testing::TestWithParam<int> {};

TEST_P(DecodeCheckDouble, TspwInDoublePassesLogitsCacheAndAnExactFreeRun) {
  const int D = GetParam();
  const DecodeReport r = check_decode_double(decode_check(D, 8, 24), tspw64_factory());
  std::cout << printed(r);
  EXPECT_TRUE(r.ok()) << printed(r);
  EXPECT_EQ(r.rows_judged, 9 * 4 * D);
  ASSERT_EQ(r.cache.size(), 4u);
  for (const std::string& line : r.cache) EXPECT_THAT(line, HasSubstr("ok   cache"));
  EXPECT_EQ(r.free_run_steps, 24);
  EXPECT_TRUE(r.near_ties.empty()) << "double has no near-ties";
  EXPECT_LE(r.worst_logits_ratio, 1.0);
  EXPECT_THAT(r.headline, HasSubstr("in double, |parallel - oracle| <= 1e-13 * max |oracle|"));
}

INSTANTIATE_TEST_SUITE_P(D, DecodeCheckDouble, ::testing::Values(2, 4));

// A planted bug: RoPE at the key's index among its owner's keys. The double check names the
// cache positions (layer, sequence, position, rank) and the logits.
TEST(DecodeCheckDoubleFault, TspwRopeAtLocalPositionsFailsTheCacheNamingLayerSequencePositionRank) {
  const DecodeReport r =
      check_decode_double(decode_check(4, 3), tspw64_factory(tsp::TspwFault::rope_local_positions));
  ASSERT_NO_FATAL_FAILURE(expect_cache_k_failures_named(r));
  EXPECT_TRUE(r.find("cache V").empty() || r.find("cache V").front()->layer >= 1)
      << "layer 0's V does not depend on RoPE";
  EXPECT_FALSE(r.find("logits").empty());
  EXPECT_THAT(printed(r), HasSubstr("verdict: FAIL"));
}

// A relative error of 1e-9 on one logit of one rank, far inside the float rule's tiny (4 fp32
// ulps, ~5e-7 relative), fails in double: the rule and the bitwise comparison with rank 0.
TEST(DecodeCheckDoubleFault, ALogitMovedBelowFloatResolutionFailsInDoubleNamingStepSequenceRank) {
  const BasicTspw<double>::Tampering tamper = [](int rank, int step, std::vector<double>& logits) {
    if (rank == 1 && step == 2) logits[96 + 5] *= 1.0 + 1e-9;  // sequence 1, vocabulary id 5
  };
  const DecodeReport r = check_decode_double(decode_check(2, 4), tspw64_factory({}, tamper));
  ASSERT_NO_FATAL_FAILURE(expect_logits_failures_at_step_2_sequence_1_rank_1_id_5(r));
  EXPECT_TRUE(r.find("cache K").empty()) << "the cache is not what was tampered with";
}

// In double a free run that leaves the reference's tokens is a failure, never a near-tie.
TEST(DecodeCheckDoubleFault, EveryRankPickingAnotherTokenFailsTheFreeRun) {
  const BasicTspw<double>::Tampering tamper = [](int, int step, std::vector<double>& logits) {
    if (step != 3) return;
    const auto top = std::max_element(logits.begin(), logits.begin() + 96);
    const double best = *top;
    *top = -1e9;
    const auto second = std::max_element(logits.begin(), logits.begin() + 96);
    *top = best;
    *second = best + 1e-12 * std::abs(best);  // a tie in any float sense
  };
  const DecodeReport r = check_decode_double(decode_check(2, 0, 8), tspw64_factory({}, tamper));
  const auto tokens = r.find("tokens");
  ASSERT_EQ(tokens.size(), 1u) << printed(r);
  EXPECT_EQ(tokens[0]->where(), "step 3 sequence 0 rank 0");
  EXPECT_THAT(tokens[0]->detail, HasSubstr("in double a schedule picks the reference's tokens"));
  EXPECT_TRUE(r.near_ties.empty());
}

TEST(DecodeCheckDouble, BadInputIsAnErrorNamingTheValue) {
  DecodeCheck c = decode_check(2, 2);
  c.rtol64 = 0;
  EXPECT_THAT([&] { check_decode_double(c, tspw64_factory()); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("rtol64=0")));
  c = decode_check(2, 2);
  c.prompts[1].clear();
  EXPECT_THAT([&] { check_decode_double(c, tspw64_factory()); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("sequence 1 is empty")));
}

TEST(DecodeCheckFault, LogitsMovedOnOneRankAtOneStepFailNamingStepSequenceAndRank) {
  const Tamper tamper = [](int rank, int step, std::vector<float>& logits) {
    if (rank == 1 && step == 2) logits[96 + 5] += 1e-2f;  // sequence 1, vocabulary id 5
  };
  const DecodeReport r = check_decode(decode_check(3, 4), reference_factory(tamper));
  ASSERT_NO_FATAL_FAILURE(expect_logits_failures_at_step_2_sequence_1_rank_1_id_5(r));
  EXPECT_THAT(printed(r), AllOf(HasSubstr("FAIL logits step 2 sequence 1 rank 1: parallel err"),
                                HasSubstr("differs from rank 0's at vocabulary id 5")));
  EXPECT_TRUE(r.find("cache K").empty()) << "the cache is not what was tampered with";
}

// Moves the second-best logit of sequence 0 above the best at step 3 on the given ranks, so
// greedy picks another token there.
Tamper another_token(const std::vector<int>& ranks) {
  return [ranks](int rank, int step, std::vector<float>& logits) {
    if (step != 3 || std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) return;
    const auto top = std::max_element(logits.begin(), logits.begin() + 96);
    const float best = *top;
    *top = -1e9f;
    const auto second = std::max_element(logits.begin(), logits.begin() + 96);
    *top = best;
    *second = best + 1.0f;
  };
}

TEST(DecodeCheckFault, ARankPickingAnotherTokenFailsTheFreeRunNamingStepSequenceAndRank) {
  const DecodeReport r = check_decode(decode_check(2, 4, 8), reference_factory(another_token({1})));
  ASSERT_FALSE(r.ok());
  const auto tokens = r.find("tokens");
  ASSERT_EQ(tokens.size(), 1u) << printed(r);
  EXPECT_EQ(tokens[0]->where(), "step 3 sequence 0 rank 1");
  EXPECT_THAT(tokens[0]->detail, HasSubstr("where rank 0 emitted"));
}

TEST(DecodeCheckFault, EveryRankPickingAnotherTokenIsABugNotANearTie) {
  const DecodeReport r =
      check_decode(decode_check(2, 4, 8), reference_factory(another_token({0, 1})));
  const auto tokens = r.find("tokens");
  ASSERT_EQ(tokens.size(), 1u) << printed(r);
  EXPECT_EQ(tokens[0]->where(), "step 3 sequence 0 rank 0");
  EXPECT_THAT(tokens[0]->detail,
              AllOf(HasSubstr("where the reference emitted"), HasSubstr("not a tie")));
  EXPECT_TRUE(r.near_ties.empty());
}

TEST(DecodeCheck, NearTieIsTwoBoundsOfTheOracleBetweenTheTwoPicks) {
  const std::vector<double> oracle{1.0, 1.0 + 1e-9, 0.2, -3.0};
  const std::vector<float> reference(oracle.begin(), oracle.end());
  double margin = 0;
  EXPECT_TRUE(near_tie(oracle, reference, 0, 1, 3.0, &margin));
  EXPECT_NEAR(margin, 1e-9, 1e-15);
  EXPECT_FALSE(near_tie(oracle, reference, 2, 1, 3.0));
  const std::vector<float> wrong{1.0f, 1.0f, std::nanf(""), -3.0f};
  EXPECT_FALSE(near_tie(oracle, wrong, 0, 1, 3.0)) << "a non-finite reference explains nothing";
}

// TSP-W's broken schedules (tspw_decoder.hpp's TspwFault) through the kit.
TEST(DecodeCheckFault, TspwRopeAtLocalPositionsFailsTheCacheNamingLayerSequencePositionRank) {
  const DecodeReport r =
      check_decode(decode_check(4, 3), tspw_factory(tsp::TspwFault::rope_local_positions));
  ASSERT_NO_FATAL_FAILURE(expect_cache_k_failures_named(r));
  EXPECT_FALSE(r.find("logits").empty());
  std::cout << printed(r);
}

TEST(DecodeCheckFault, TspwKvWrittenToTheWrongOwnerFailsTheRunNamingRankAndStep) {
  const DecodeReport r =
      check_decode(decode_check(3, 3, 8), tspw_factory(tsp::TspwFault::kv_wrong_owner));
  const auto runs = r.find("schedule");
  ASSERT_EQ(runs.size(), 1u) << printed(r);
  EXPECT_GE(runs[0]->rank, 0);
  EXPECT_THAT(runs[0]->detail, AllOf(HasSubstr("teacher-forced run failed in decode step 1"),
                                     HasSubstr("is not this rank's to hold")));
  EXPECT_EQ(r.rows_judged, 0) << "no verdict on the logits of a failed run";
  EXPECT_EQ(r.free_run_steps, 0) << "nor a free run";
}

TEST(DecodeCheckFault, TspwEmptyShardReturningNanFailsTheShortSequenceOnly) {
  const DecodeReport r =
      check_decode(decode_check(4, 2), tspw_factory(tsp::TspwFault::empty_shard_nan));
  const auto logits = r.find("logits");
  ASSERT_FALSE(logits.empty()) << printed(r);
  for (const DecodeFailure* f : logits) EXPECT_EQ(f->sequence, 0) << f->where();  // length 1
  EXPECT_EQ(logits.front()->where(), "step 0 sequence 0 rank 0");
}

TEST(DecodeCheckFault, AScheduleThrowingOnOneRankFailsTheRunNamingThatRankAndStep) {
  const DecoderFactory throwing = [](DecodeRank& dr) -> std::unique_ptr<RankDecoder> {
    struct Throws : ReferenceDecoder {
      using ReferenceDecoder::ReferenceDecoder;
      int rank = 0, steps = 0;
      std::vector<float> decode_step(std::span<const std::int32_t> tokens) override {
        if (rank == 2 && ++steps == 2) throw std::runtime_error("user bug");
        return ReferenceDecoder::decode_step(tokens);
      }
    };
    auto d = std::make_unique<Throws>(dr, Tamper{});
    d->rank = dr.rank().id();
    return d;
  };
  const DecodeReport r = check_decode(decode_check(3, 4), throwing);
  const auto runs = r.find("schedule");
  ASSERT_EQ(runs.size(), 1u) << printed(r);
  EXPECT_EQ(runs[0]->rank, 2);
  EXPECT_THAT(runs[0]->detail, AllOf(HasSubstr("decode step 2"), HasSubstr("user bug")));
}

TEST(DecodeCheck, AScheduleWithoutACacheFailsNamingTheFix) {
  const DecoderFactory no_cache = [](DecodeRank& dr) -> std::unique_ptr<RankDecoder> {
    struct NoCache : RankDecoder {
      explicit NoCache(DecodeRank& dr) : inner(dr, {}) {}
      ReferenceDecoder inner;
      std::vector<float> prefill(const Prompts& p) override { return inner.prefill(p); }
      std::vector<float> decode_step(std::span<const std::int32_t> t) override {
        return inner.decode_step(t);
      }
    };
    return std::make_unique<NoCache>(dr);
  };
  DecodeCheck c = decode_check(1, 2);
  const DecodeReport r = check_decode(c, no_cache);
  ASSERT_EQ(r.find("schedule").size(), 1u) << printed(r);
  EXPECT_THAT(r.find("schedule")[0]->detail, HasSubstr("check_cache = false"));
  c.check_cache = false;
  EXPECT_TRUE(check_decode(c, no_cache).ok());
}

// The user's own weights (here with a tied LM head, so lm_head is the embedding) are decoded
// with; weights of another config are refused.
TEST(DecodeCheck, GivenWeightsWithATiedHeadAreDecodedWithAndAMismatchIsRefused) {
  DecodeCheck c = decode_check(2, 4, 8);
  c.model.tie_embeddings = true;
  c.weights =
      std::make_shared<const ref::ModelWeights<float>>(ref::init_weights<float>(c.model, 3));
  const DecodeReport r = check_decode(c, tspw_factory());
  EXPECT_TRUE(r.ok()) << printed(r);
  c.model.tie_embeddings = false;
  EXPECT_THAT([&] { check_decode(c, tspw_factory()); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("tied=1")));
}

TEST(DecodeCheck, BadInputIsAnErrorNamingTheValue) {
  DecodeCheck c = decode_check(2, 2);
  c.prompts[1].clear();
  EXPECT_THAT(
      [&] { check_decode(c, reference_factory()); },
      ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("prompt of sequence 1 is empty")));
  c = decode_check(2, 2);
  c.prompts[2][3] = 96;
  EXPECT_THAT([&] { check_decode(c, reference_factory()); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("sequence 2 position 3 has token 96 outside [0, 96)")));
  c = decode_check(2, 4);
  c.max_context = 14;
  EXPECT_THAT([&] { check_decode(c, reference_factory()); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("max_context=14")));
}

}  // namespace
}  // namespace tspemu::check

namespace tspemu::check {
namespace {

// RowDecoder (row_decoder.hpp) hands step() the new tokens as rows and refuses bad input first.
TEST(RowDecoder, HandsStepTheRowsAndRefusesBadInputNamingRankSequencePositionValue) {
  struct Rows : RowDecoder {
    using RowDecoder::RowDecoder;
    std::vector<std::vector<DecodeRow>> seen;
    std::vector<float> step(std::span<const DecodeRow> rows) override {
      seen.emplace_back(rows.begin(), rows.end());
      return {};
    }
  };
  const ref::ModelConfig cfg = tsp::testing::tspw_test_model(2);
  const auto w = ref::init_weights<float>(cfg, 1);
  World world({.ranks = 1});
  world.run([&](Rank& rank) {
    DecodeRank dr(rank, w, 2, 4);
    Rows d(dr);
    const std::vector<std::int32_t> two{1, 2};
    EXPECT_THAT([&] { d.decode_step(two); }, ::testing::ThrowsMessage<std::invalid_argument>(
                                                 HasSubstr("rank 0: decode_step: before prefill")));
    EXPECT_THAT(
        [&] {
          d.prefill({{1}, {2, 96}});
        },
        ::testing::ThrowsMessage<std::invalid_argument>(
            HasSubstr("sequence 1 position 1 has token 96 outside [0, 96)")));
    d.prefill({{5, 6, 7}, {8}});
    ASSERT_EQ(d.seen.size(), 1u);
    ASSERT_EQ(d.seen[0].size(), 4u);
    EXPECT_EQ(d.seen[0][2].seq, 0);
    EXPECT_EQ(d.seen[0][2].pos, 2);
    EXPECT_EQ(d.seen[0][3].seq, 1);
    EXPECT_EQ(d.seen[0][3].token, 8);
    EXPECT_THAT([&] { d.decode_step(std::vector<std::int32_t>{1}); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("1 tokens for B=2")));
    d.decode_step(two);
    EXPECT_EQ(d.seen[1][0].pos, 3);
    EXPECT_EQ(d.seen[1][1].pos, 1);
    EXPECT_EQ(d.seen[1][1].token, 2);
    EXPECT_THAT([&] { d.decode_step(two); },
                ::testing::ThrowsMessage<std::length_error>(
                    HasSubstr("sequence 0 would hold position 4, beyond max_context=4")));
    EXPECT_EQ(d.kv_cache()->batch(), 2);
  });
}

}  // namespace
}  // namespace tspemu::check
