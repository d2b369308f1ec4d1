// Helix decoding (helix_decoder.hpp) against the reference decoder (reference/decode.hpp), the
// fp64 oracle (the double reference) and the planner's closed forms (plan/decode_cost.hpp).
//
// Shapes (small GQA models, L = 2, F = V = 96), N = KVP × TP_A: N = 2 as 2×1; N = 4 as 4×1 and
// 2×2 (NH=8, NKV=4); N = 3 as 3×1 (NH=6, NKV=3, I = 3); N = 8 as 8×1, 4×2 and 2×4 (NH=16, NKV=8)
// and 2×4 on NKV=2 (TP_A > NKV: each KV head on 2 head shards). Interleave I = 1 but 2 at 4×2.
// Five prompts of lengths 1 (shorter than every KVP: token shards with no key of it), 7, 13, 12,
// 16.
//
// Bounds (as tspw_decoder_test.cpp, whose file comment derives them):
//   - float logits per step, teacher-forced on the oracle's greedy tokens: err(Helix fp32) <=
//     3·err(reference fp32) + tiny against the double reference (decode_test_support.hpp).
//   - double greedy tokens: equal to the double reference's for 256 steps.
//   - double KV cache: each rank holds exactly its token shard's positions, K and V of its head
//     shard equal to the reference cache's slice: layer 0 exactly, later layers within 1e-13 of
//     the largest magnitude (sums split over N ranks, added in rank order).
//   - traffic and KV bytes: == (integers).
#include "tspemu/tsp/helix_decoder.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "decode_test_support.hpp"
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
using testing::longest;
using testing::Prompts;
using ::testing::ThrowsMessage;

struct HelixCase {
  int kvp, tpa, NH, NKV, hidden, I;
  int N() const { return kvp * tpa; }
  std::string label() const {
    return "KVP=" + std::to_string(kvp) + " TP_A=" + std::to_string(tpa) +
           " NKV=" + std::to_string(NKV);
  }
};

std::string helix_case_name(const ::testing::TestParamInfo<HelixCase>& i) {
  return "KVP" + std::to_string(i.param.kvp) + "_TPA" + std::to_string(i.param.tpa) + "_NKV" +
         std::to_string(i.param.NKV);
}

const HelixCase kHelixCases[] = {{2, 1, 8, 4, 64, 1},  {4, 1, 8, 4, 64, 1},  {2, 2, 8, 4, 64, 1},
                                 {3, 1, 6, 3, 48, 3},  {8, 1, 16, 8, 64, 1}, {4, 2, 16, 8, 64, 2},
                                 {2, 4, 16, 8, 64, 1}, {2, 4, 8, 2, 64, 1}};

ref::ModelConfig helix_model(const HelixCase& c) {
  return testing::small_gqa_model(c.NH, c.NKV, c.hidden);
}

DecodeShape helix_shape(const HelixCase& c, int B, std::int64_t max_context) {
  return DecodeShape{.model = helix_model(c),
                     .D = c.N(),
                     .batch = B,
                     .max_context = max_context,
                     .interleave = c.I};
}

template <class T>
auto helix_factory(const DecodeShape& s, int kvp, const ref::ModelWeights<T>& w,
                   HelixFault fault = HelixFault::none) {
  return [&s, kvp, &w, fault](Rank& rank) {
    return std::make_unique<BasicHelixDecoder<T>>(rank, s, kvp, w, fault);
  };
}

// The planner's KV cache bytes of token shard k: the positions it reserves below max_context.
std::uint64_t helix_planned_kv_bytes(const HelixCase& c, const Prompts& prompts,
                                     std::int64_t max_context, int k, std::uint64_t beta) {
  return testing::planned_kv_bytes(helix_model(c), cost::DecodeStrategy::helix(c.kvp, c.tpa),
                                   prompts, max_context, c.kvp, c.I, k, beta);
}

// The stages of a Helix decode step under the planner's names.
std::vector<std::pair<std::string, const TrafficCounters*>> helix_named_stages(
    const HelixTraffic& t) {
  return {{"partials all-to-all", &t.partials},
          {"W_O all-reduce", &t.o_proj},
          {"MLP down all-reduce", &t.mlp},
          {"embedding all-reduce", &t.embedding},
          {"LM head logits all-gather", &t.lm_head}};
}

// ---------------------------------------------------------------- shape validation

TEST(HelixDecodeShape, RefusesTpaNeitherDividingNorAMultipleOfNkvNamingTpaAndNkv) {
  const HelixCase c{2, 4, 12, 6, 48, 1};  // N = 8 does not divide NH = 12 either
  const DecodeShape s = helix_shape(c, 1, 8);
  EXPECT_THAT([&] { validate_helix(s, c.kvp); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("TP_A=4"), HasSubstr("NKV=6"))));
  const auto w = ref::init_weights<float>(s.model, 1);
  World world({.ranks = c.N()});
  EXPECT_THROW(world.run([&](Rank& r) { HelixDecoder dec(r, s, c.kvp, w); }), std::exception);
}

TEST(HelixDecodeShape, RefusesEveryOtherBadValueNamingIt) {
  const HelixCase c = kHelixCases[2];  // 2×2
  const DecodeShape good = helix_shape(c, 2, 8);
  for (const int kvp : {3, 0})
    EXPECT_THAT([&] { validate_helix(good, kvp); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("KVP=" + std::to_string(kvp))));
  auto bad = testing::common_bad_values<DecodeShape>();
  bad.insert(bad.end(), {{[](DecodeShape& s) { s.model.vocab = 98; }, "V=98"},
                         {[](DecodeShape& s) { s.model.ffn = 90; }, "F=90"},
                         // TP_A = 8 divides NH = 8, N = 16 does not
                         {[](DecodeShape& s) { s.D = 16; }, "N=16"}});
  testing::expect_bad_values_refused(
      "Helix decode", good, [&c](const DecodeShape& s) { validate_helix(s, c.kvp); }, bad);
  for (const HelixCase& ok : kHelixCases)
    EXPECT_NO_THROW(validate_helix(helix_shape(ok, 1, 8), ok.kvp)) << ok.label();
}

TEST(HelixDecoder, BadInputIsRefusedNamingSequencePositionAndValue) {
  const HelixCase c = kHelixCases[2];
  const DecodeShape s = helix_shape(c, 2, 8);
  const auto w = ref::init_weights<float>(s.model, 2);
  testing::expect_decoder_refuses_bad_input(c.N(), helix_factory(s, c.kvp, w), "Helix decode");
}

// ---------------------------------------------------------------- float, teacher-forced

class HelixFloat : public ::testing::TestWithParam<HelixCase> {};

TEST_P(HelixFloat, LogitsOfEveryStepTeacherForcedPassTheOracleRule) {
  const HelixCase c = GetParam();
  const ref::ModelConfig cfg = helix_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 5);
  const DecodeShape s =
      helix_shape(c, static_cast<int>(prompts.size()), longest(prompts) + kForcedSteps + 1);
  const auto w64 = ref::init_weights<double>(cfg, 11);
  const auto w32 = ref::init_weights<float>(cfg, 11);
  const testing::ForcedResult r =
      testing::judge_teacher_forced(c.label(), c.N(), w64, w32, prompts, s.max_context,
                                    kForcedSteps, helix_factory(s, c.kvp, w32));
  std::cout << c.label() << ": worst err(Helix fp32)/err(reference fp32) over " << r.steps
            << " steps " << r.worst_ratio << "\n";
}

INSTANTIATE_TEST_SUITE_P(Shapes, HelixFloat, ::testing::ValuesIn(kHelixCases), helix_case_name);

// ---------------------------------------------------------------- double, free-running greedy

class HelixGreedy : public ::testing::TestWithParam<HelixCase> {};

// One double run of 256 free-running greedy steps per shape: the tokens against the reference's,
// every rank's logits against rank 0's (bitwise), every rank's cache against the reference
// cache (its token shard's positions, its head shard's KV heads), and each rank's KV bytes
// against the planner and its arena.
TEST_P(HelixGreedy, DoubleRunOf256StepsEqualsTheReferenceOnEveryRank) {
  const HelixCase c = GetParam();
  const ref::ModelConfig cfg = helix_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 7);
  const DecodeShape s =
      helix_shape(c, static_cast<int>(prompts.size()), longest(prompts) + kGreedySteps + 3);
  const auto w = ref::init_weights<double>(cfg, 13);
  testing::judge_greedy_run(
      c.label(), c.N(), w, prompts, s.max_context, kCacheRtol, helix_factory(s, c.kvp, w),
      [](Rank& /*rank*/, const BasicHelixDecoder<double>& dec) { return dec.first_kv_head(); },
      [&](int r) { return helix_planned_kv_bytes(c, prompts, s.max_context, r / c.tpa, 8); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, HelixGreedy, ::testing::ValuesIn(kHelixCases), helix_case_name);

// ---------------------------------------------------------------- traffic, determinism

class HelixTrafficModel : public ::testing::TestWithParam<HelixCase> {};

// Every stage of every decode step, on every rank, equals the planner's
// decode_stage_traffic(helix(KVP, TP_A)) for the step's B new tokens (float: the planner's 4-byte
// LSE is the decoder's T), the totals equal decode_step_traffic, and each rank's KV bytes equal
// the planner's per-token bytes over its token shard's reserved positions.
TEST_P(HelixTrafficModel, EveryStageOfEveryDecodeStepOnEveryRankEqualsThePlannersClosedForm) {
  const HelixCase c = GetParam();
  const ref::ModelConfig cfg = helix_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 11);
  const int steps = 4;
  const DecodeShape s =
      helix_shape(c, static_cast<int>(prompts.size()), longest(prompts) + steps + 1);
  const auto w = ref::init_weights<float>(cfg, 29);
  testing::judge_decode_traffic(
      c.label(), c.N(), cfg, cost::DecodeStrategy::helix(c.kvp, c.tpa), prompts, s.max_context,
      steps, helix_factory(s, c.kvp, w), helix_named_stages, [&](int r) {
        return helix_planned_kv_bytes(c, prompts, s.max_context, r / c.tpa, sizeof(float));
      });
}

INSTANTIATE_TEST_SUITE_P(Shapes, HelixTrafficModel, ::testing::ValuesIn(kHelixCases),
                         helix_case_name);

TEST(HelixDecoder, TwoRunsAreBitwiseIdentical) {
  const HelixCase c = kHelixCases[5];  // 4×2, I = 2
  const ref::ModelConfig cfg = helix_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 9);
  const DecodeShape s = helix_shape(c, static_cast<int>(prompts.size()), longest(prompts) + 20);
  const auto w = ref::init_weights<float>(cfg, 17);
  testing::expect_deterministic(c.N(), helix_factory(s, c.kvp, w), prompts, 16);
}

TEST(HelixDecoder, ASequencesLogitsDoNotDependOnItsBatchMatesInDouble) {
  const HelixCase c = kHelixCases[2];  // 2×2
  const int steps = 24;
  const ref::ModelConfig cfg = helix_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 3);
  const auto w = ref::init_weights<double>(cfg, 19);
  const std::int64_t max_context = longest(prompts) + steps + 1;
  testing::expect_batch_independent(prompts, {0, 2}, [&](const Prompts& p) {
    const DecodeShape s = helix_shape(c, static_cast<int>(p.size()), max_context);
    return testing::run_decoder<double>(c.N(), helix_factory(s, c.kvp, w), p, steps);
  });
}

// A token shard holding no key of a sequence (the prompt of length 1 on KVP = 4) contributes
// (0, -inf): every logit of every rank stays finite from the prefill on.
TEST(HelixDecoder, EmptyTokenShardsKeepEveryLogitFinite) {
  const HelixCase c = kHelixCases[1];  // 4×1
  const ref::ModelConfig cfg = helix_model(c);
  Prompts prompts = testing::test_prompts(cfg.vocab, 9);
  prompts.resize(2);  // lengths 1 and 7: sequence 0 has keys on token shard 0 only
  const DecodeShape s = helix_shape(c, 2, longest(prompts) + 3);
  const auto w = ref::init_weights<float>(cfg, 31);
  const auto runs = testing::run_decoder<float>(c.N(), helix_factory(s, c.kvp, w), prompts, 2);
  for (std::size_t r = 0; r < runs.size(); ++r)
    for (std::size_t step = 0; step < runs[r].logits.size(); ++step)
      for (const float x : runs[r].logits[step])
        ASSERT_TRUE(std::isfinite(x)) << "rank " << r << " step " << step;
}

// The o_proj shard check, which names the rank and layer the logits check cannot (the o_proj
// all-reduce sums every rank's share before anyone sees it): rank (k, a) = k·TP_A + a must hold
// W_O's columns of head block a·KVP + k, the heads its attention output holds after the
// all-to-all (helix_decoder.hpp). One line per (rank, layer) whose shard is other columns, naming
// the block it holds (by content: the master's block equal to it bit for bit) and the block due.
template <class T>
std::vector<std::string> o_proj_shard_faults(const HelixCase& c, const DecodeShape& s,
                                             const ref::ModelWeights<T>& w, HelixFault fault) {
  const ref::ModelConfig& m = s.model;
  const auto C = static_cast<std::size_t>(m.hidden), qd = static_cast<std::size_t>(m.q_dim());
  const auto qn =
      static_cast<std::size_t>(m.n_heads / c.N()) * static_cast<std::size_t>(m.head_size());
  std::vector<std::string> found;
  std::mutex mu;
  World world({.ranks = c.N()});
  world.run([&](Rank& rank) {
    const BasicHelixDecoder<T> dec(rank, s, c.kvp, w, fault);
    const int r = rank.id(), k = r / c.tpa, a = r % c.tpa, due = a * c.kvp + k;
    for (int l = 0; l < m.n_layers; ++l) {
      const std::span<const T> shard = dec.o_proj_shard(l);
      const std::vector<T>& wo = w.layers[static_cast<std::size_t>(l)].wo;  // [C, NH·hs]
      auto is_block = [&](int b) {
        for (std::size_t i = 0; i < C; ++i)
          for (std::size_t j = 0; j < qn; ++j)
            if (shard[i * qn + j] != wo[i * qd + static_cast<std::size_t>(b) * qn + j])
              return false;
        return true;
      };
      if (shard.size() == C * qn && is_block(due)) continue;
      std::string held = "none of W_O's head blocks";
      for (int b = 0; b < c.N() && shard.size() == C * qn; ++b)
        if (is_block(b)) held = "W_O's head block " + std::to_string(b);
      const std::lock_guard<std::mutex> lock(mu);
      found.push_back("rank " + std::to_string(r) + " layer " + std::to_string(l) +
                      ": o_proj shard holds " + held + ", due head block " + std::to_string(due) +
                      " (a·KVP + k with k=" + std::to_string(k) + ", a=" + std::to_string(a) + ")");
    }
  });
  std::sort(found.begin(), found.end());
  return found;
}

// A group mapping that hands rank r W_O's head block r instead of a·KVP + k (TRT-LLM PR #10350,
// Helix TP2×CP2): the teacher-forced check fails on the first logits, while the same shape
// without the fault passes (HelixFloat above); on 2×2 the blocks of ranks 1 and 2 are swapped,
// which the o_proj shard check names, rank and layer, in every layer (and fault-free, nowhere).
TEST(HelixFault, OProjShardByRankIsCaughtByTheOracleRule) {
  const HelixCase c = kHelixCases[2];  // 2×2
  const ref::ModelConfig cfg = helix_model(c);
  const Prompts prompts = testing::test_prompts(cfg.vocab, 5);
  const DecodeShape s = helix_shape(c, static_cast<int>(prompts.size()), longest(prompts) + 2);
  const auto w64 = ref::init_weights<double>(cfg, 11);
  const auto w32 = ref::init_weights<float>(cfg, 11);
  const ref::Generation<double> oracle = testing::greedy_oracle(w64, prompts, s.max_context, 0);
  const auto runs = testing::run_decoder<float>(
      c.N(), helix_factory(s, c.kvp, w32, HelixFault::o_proj_by_rank), prompts, 0);
  const auto pre = ref::prefill(w32, prompts, s.max_context);
  const auto v = ref::check_close("prefill logits", runs[0].logits[0], pre.logits, oracle.logits[0],
                                  testing::kOracleFactor);
  EXPECT_FALSE(v) << "the wrong o_proj shard went unnoticed";
  std::cout << v.report << "\n";

  EXPECT_THAT(o_proj_shard_faults(c, s, w32, HelixFault::none), ::testing::IsEmpty());
  const std::vector<std::string> found = o_proj_shard_faults(c, s, w32, HelixFault::o_proj_by_rank);
  ASSERT_EQ(found.size(), static_cast<std::size_t>(2 * cfg.n_layers))
      << ::testing::PrintToString(found);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string layer = " layer " + std::to_string(l) + ": o_proj shard holds ";
    EXPECT_THAT(found, ::testing::Contains("rank 1" + layer +
                                           "W_O's head block 1, due head block 2 (a·KVP + k with "
                                           "k=0, a=1)"));
    EXPECT_THAT(found, ::testing::Contains("rank 2" + layer +
                                           "W_O's head block 2, due head block 1 (a·KVP + k with "
                                           "k=1, a=0)"));
  }
  std::cout << found.front() << "\n";
}

}  // namespace
}  // namespace tspemu::tsp
