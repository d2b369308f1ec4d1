// TSP-W decoding (tspw_decoder.hpp) against the reference decoder (reference/decode.hpp) and the
// fp64 oracle (the double reference), token by token.
//
// Shapes: small GQA models (g = 2) with D | NH, NKV, F, V: D = 2 and 4 on NH=8, NKV=4 (two and one
// KV heads per rank), D = 3 on NH=6, NKV=3, D = 8 on NH=16, NKV=8; L=2, F=V=96. One batch of five
// prompts of lengths 1 (shorter than D: ranks without a key of it at first), 7 and 13 (prime), 12
// and 16 (zigzag where 2D divides them, blocks elsewhere). Interleave I = 1, 3 (D=3), 2 (D=8).
//
// Bounds:
//   - float logits per step: the project's rule (reference/numerics.hpp), teacher-forced on the
//     oracle's greedy tokens so errors do not compound: err(TSP-W fp32) <= 3·err(reference fp32)
//     + tiny, against the double reference.
//   - double greedy tokens: equal to the double reference's for 256 steps (a near-tie would need a
//     top-1/top-2 margin below ~1e-12 of the logits; none occurs, and a schedule bug moves logits
//     by O(1)).
//   - double KV cache contents: layer 0's keys and values are computed by the same arithmetic as
//     the reference's (the embedding row is exact, the per-row norm is the same, and each
//     K/V element is one dot product over C of the same operands: a column shard of the reference's
//     GEMM; RoPE at the same global position), so they are compared for equality; later layers see
//     a residual whose o_proj and down sums are split over D ranks and added in rank order, so they
//     differ by reordered double sums: <= 1e-13 of the largest magnitude (kCacheRtol: the argument
//     of tests/reference/decode_test.cpp's kCachedRtol; the D-way split adds one more reordered
//     sum of D terms per block, far below its slack; measured ~1.3e-15).
#include "tspemu/tsp/tspw_decoder.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode_test_support.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspw_test_model.hpp"

namespace tspemu::tsp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::kCacheRtol;
using testing::kForcedSteps;
using testing::kGreedySteps;
using testing::kOracleFactor;
using testing::longest;
using testing::max_magnitude;
using testing::Prompts;
using ::testing::ThrowsMessage;

ref::ModelConfig model_for(int D) {
  return testing::tspw_test_model(D);
}

int tspw_interleave(int D) {
  return D == 3 ? 3 : (D == 8 ? 2 : 1);
}

Prompts prompts_for(const ref::ModelConfig& c, unsigned seed = 5) {
  return testing::test_prompts(c.vocab, seed);
}

DecodeShape tspw_shape(int D, int B, std::int64_t max_context) {
  DecodeShape s;
  s.model = model_for(D);
  s.D = D;
  s.batch = B;
  s.max_context = max_context;
  s.interleave = tspw_interleave(D);
  return s;
}

template <class T>
using RankRun = testing::RankRun<T, TspwTraffic>;

// The per-rank TSP-W decoder of shape s over the master weights w, with a test-only fault.
template <class T>
auto tspw_factory(const DecodeShape& s, const ref::ModelWeights<T>& w,
                  TspwFault fault = TspwFault::none) {
  return [&s, &w, fault](Rank& rank) {
    return std::make_unique<BasicTspwDecoder<T>>(rank, s, w, fault);
  };
}

// Prefill, then `steps` decode steps on D ranks (testing::run_decoder). feed[i] ([B]) is fed at
// step i; without it, each rank feeds the greedy tokens of its own previous logits. `inspect`
// sees each rank's decoder at the end, inside the run.
template <class T>
std::vector<RankRun<T>> run_tspw(
    const DecodeShape& s, const ref::ModelWeights<T>& w, const Prompts& prompts, int steps,
    const std::vector<std::vector<std::int32_t>>* feed = nullptr,
    const std::function<void(Rank&, const BasicTspwDecoder<T>&)>& inspect = {},
    TspwFault fault = TspwFault::none) {
  return testing::run_decoder<T>(s.D, tspw_factory(s, w, fault), prompts, steps, feed,
                                 [&](Rank& rank, const BasicTspwDecoder<T>& dec) {
                                   if (inspect) inspect(rank, dec);
                                 });
}

// One rank's cache against the reference's (testing::cache_mismatches: every KV head, the bound
// of the file comment).
std::vector<std::string> cache_mismatches(int rank, const RankKvCache<double>& kv,
                                          const ref::KvCache<double>& want, double max_mag,
                                          double& worst) {
  return testing::cache_mismatches(rank, kv, 0, want, max_mag, kCacheRtol, worst);
}

// ---------------------------------------------------------------- shape validation

TEST(TspwDecodeShape, RefusesDNotDividingKvHeadsNamingDAndNkv) {
  DecodeShape s = tspw_shape(4, 1, 8);
  s.D = 8;
  s.model.n_heads = 8;
  s.model.n_kv_heads = 4;
  EXPECT_THAT([&] { s.validate(); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("D=8"), HasSubstr("NKV=4"))));
  World world({.ranks = 8});
  const auto w = ref::init_weights<float>(s.model, 1);
  EXPECT_THROW(world.run([&](Rank& r) { TspwDecoder dec(r, s, w); }), std::exception);
}

TEST(TspwDecodeShape, RefusesEveryOtherBadValueNamingIt) {
  auto bad = testing::common_bad_values<DecodeShape>();
  bad.insert(bad.end(), {{[](DecodeShape& s) { s.model.vocab = 98; }, "V=98"},
                         {[](DecodeShape& s) { s.model.ffn = 90; }, "F=90"}});
  testing::expect_bad_values_refused(
      "TSP-W decode", tspw_shape(4, 2, 8), [](const DecodeShape& s) { s.validate(); }, bad);
}

TEST(TspwDecoder, BadInputIsRefusedNamingSequencePositionAndValue) {
  const DecodeShape s = tspw_shape(2, 2, 8);
  const auto w = ref::init_weights<float>(s.model, 2);
  testing::expect_decoder_refuses_bad_input(2, tspw_factory(s, w), "TSP-W decode");
}

// ---------------------------------------------------------------- float, teacher-forced

// A teacher-forced float run's inputs (testing::teacher_forced_inputs) on weights seeded 11, and
// the float weights every side runs.
struct TeacherForced : testing::ForcedInputs {
  ref::ModelWeights<float> w32;
};

TeacherForced teacher_forced(const DecodeShape& s, const Prompts& prompts, int steps) {
  TeacherForced t;
  t.w32 = ref::init_weights<float>(s.model, 11);
  static_cast<testing::ForcedInputs&>(t) = testing::teacher_forced_inputs(
      ref::init_weights<double>(s.model, 11), t.w32, prompts, s.max_context, steps);
  return t;
}

class TspwFloat : public ::testing::TestWithParam<int> {};

TEST_P(TspwFloat, LogitsOfEveryStepTeacherForcedPassTheOracleRule) {
  const int D = GetParam();
  const ref::ModelConfig cfg = model_for(D);
  const Prompts prompts = prompts_for(cfg);
  const int B = static_cast<int>(prompts.size());
  const DecodeShape s = tspw_shape(D, B, longest(prompts) + kForcedSteps + 1);
  const auto w64 = ref::init_weights<double>(cfg, 11);
  const auto w32 = ref::init_weights<float>(cfg, 11);
  const testing::ForcedResult r =
      testing::judge_teacher_forced("D=" + std::to_string(D), D, w64, w32, prompts, s.max_context,
                                    kForcedSteps, tspw_factory(s, w32));
  std::cout << "D=" << D << ": worst err(TSP-W fp32)/err(reference fp32) over " << r.steps
            << " steps " << r.worst_ratio << "\n";
}

INSTANTIATE_TEST_SUITE_P(D, TspwFloat, ::testing::Values(2, 3, 4, 8));

// ---------------------------------------------------------------- double, free-running greedy

struct GreedyCase {
  DecodeShape shape;
  Prompts prompts;
  testing::GreedyRun<TspwTraffic> run;
  std::vector<std::string> cache_errors;  // one line per mismatch, per rank
  double cache_worst_rel = 0;             // layers >= 1, relative to the tensor's max magnitude
};

GreedyCase greedy_case(int D) {
  GreedyCase c;
  const ref::ModelConfig cfg = model_for(D);
  c.prompts = prompts_for(cfg, 7);
  const int B = static_cast<int>(c.prompts.size());
  c.shape = tspw_shape(D, B, longest(c.prompts) + kGreedySteps + 3);
  const auto w = ref::init_weights<double>(cfg, 13);
  std::mutex m;
  auto inspect = [&](Rank& rank, const BasicTspwDecoder<double>& dec,
                     const ref::Generation<double>& oracle) {
    const double max_mag = max_magnitude(oracle.cache);
    double worst = 0;
    const auto errors = cache_mismatches(rank.id(), dec.cache(), oracle.cache, max_mag, worst);
    const std::lock_guard lock(m);
    c.cache_errors.insert(c.cache_errors.end(), errors.begin(), errors.end());
    c.cache_worst_rel = std::max(c.cache_worst_rel, worst);
  };
  c.run = testing::run_greedy(D, w, c.prompts, c.shape.max_context, kGreedySteps,
                              tspw_factory(c.shape, w), inspect);
  return c;
}

class TspwGreedy : public ::testing::TestWithParam<int> {};

// One double run of 256 free-running greedy steps per D, checked four ways: the tokens against
// the reference's, every rank's logits against rank 0's (bitwise), every rank's KV cache against
// the reference cache, and each rank's kv_cache_bytes against the closed form and its arena.
TEST_P(TspwGreedy, DoubleRunOf256StepsEqualsTheReferenceOnEveryRank) {
  const GreedyCase c = greedy_case(GetParam());
  const DecodeShape& s = c.shape;
  const int B = s.batch;
  ASSERT_NO_FATAL_FAILURE(
      testing::expect_greedy_equals_oracle("D=" + std::to_string(s.D), c.run, kGreedySteps));

  for (const std::string& e : c.cache_errors) ADD_FAILURE() << e;
  std::cout << "D=" << s.D << ": KV cache, layers >= 1, worst |TSP-W - reference| / max "
            << c.cache_worst_rel << " (layer 0 exact)\n";

  std::vector<std::int64_t> lengths;
  for (const auto& p : c.prompts) lengths.push_back(static_cast<std::int64_t>(p.size()));
  const KvOwnership own(s.D, s.interleave, lengths);
  for (int r = 0; r < s.D; ++r) {
    std::size_t positions = 0;  // owned below max_context, by the position -> rank map
    for (int b = 0; b < B; ++b)
      for (std::int64_t p = 0; p < s.max_context; ++p) positions += own.owner(b, p) == r ? 1 : 0;
    const std::size_t raw = 2 * static_cast<std::size_t>(s.model.n_layers) *
                            static_cast<std::size_t>(s.model.kv_dim()) * sizeof(double) * positions;
    const std::size_t want = (raw + 63) / 64 * 64;
    const RankRun<double>& run = c.run.runs[static_cast<std::size_t>(r)];
    EXPECT_EQ(run.kv_cache_bytes, want) << "rank " << r;
    EXPECT_EQ(run.arena_kv_cache, want) << "rank " << r;
  }
  const TrafficCounters t = c.run.runs[0].traffic.total();
  std::cout << "D=" << s.D << " B=" << B
            << ": decode step traffic on rank 0: " << t.total_received() << " B received, "
            << t.total_sent() << " B sent; kv cache " << c.run.runs[0].kv_cache_bytes
            << " B per rank\n";
}

INSTANTIATE_TEST_SUITE_P(D, TspwGreedy, ::testing::Values(2, 3, 4, 8));

// ---------------------------------------------------------------- determinism, independence

TEST(TspwDecoder, TwoRunsAreBitwiseIdentical) {
  const int D = 3;
  const ref::ModelConfig cfg = model_for(D);
  const Prompts prompts = prompts_for(cfg, 9);
  const DecodeShape s = tspw_shape(D, static_cast<int>(prompts.size()), longest(prompts) + 20);
  const auto w = ref::init_weights<float>(cfg, 17);
  testing::expect_deterministic(D, tspw_factory(s, w), prompts, 16);
}

// One decode step's bytes per stage on every rank equal the closed forms of tspw_decoder.hpp's
// Cost line (what the planner's decode branch compares last_traffic() with).
TEST(TspwDecoder, DecodeStepTrafficOfEveryStageEqualsTheHeaderClosedForm) {
  const int D = 4;
  const ref::ModelConfig cfg = model_for(D);
  Prompts prompts = prompts_for(cfg, 4);
  prompts.resize(3);
  const std::uint64_t B = prompts.size(), L = static_cast<std::uint64_t>(cfg.n_layers);
  const std::uint64_t d = D, f = sizeof(float), C = static_cast<std::uint64_t>(cfg.hidden);
  const std::uint64_t NH = static_cast<std::uint64_t>(cfg.n_heads);
  const std::uint64_t NKV = static_cast<std::uint64_t>(cfg.n_kv_heads);
  const std::uint64_t hs = static_cast<std::uint64_t>(cfg.head_size());
  const std::uint64_t V = static_cast<std::uint64_t>(cfg.vocab);
  const auto w = ref::init_weights<float>(cfg, 23);
  const auto runs =
      run_tspw<float>(tspw_shape(D, static_cast<int>(B), longest(prompts) + 2), w, prompts, 1);
  const std::uint64_t all_reduce_bytes = 2 * (d - 1) * B * C / d * f;  // ring volume, D | B·C
  for (int r = 0; r < D; ++r) {
    const TspwTraffic& t = runs[static_cast<std::size_t>(r)].traffic;
    const std::string at = "rank " + std::to_string(r);
    EXPECT_EQ(t.embedding[CollectiveKind::all_reduce].bytes_received, all_reduce_bytes) << at;
    EXPECT_EQ(t.kv_route[CollectiveKind::all_gather].bytes_received,
              L * (d - 1) * B * 2 * NKV / d * hs * f)
        << at;
    EXPECT_EQ(t.q_gather[CollectiveKind::all_gather].bytes_received,
              L * (d - 1) * B * NH / d * hs * f)
        << at;
    EXPECT_EQ(t.partials[CollectiveKind::all_to_all].bytes_received,
              L * (d - 1) * B * NH / d * (hs + 1) * f)
        << at;
    EXPECT_EQ(t.o_proj[CollectiveKind::all_reduce].bytes_received, L * all_reduce_bytes) << at;
    EXPECT_EQ(t.mlp[CollectiveKind::all_reduce].bytes_received, L * all_reduce_bytes) << at;
    EXPECT_EQ(t.lm_head[CollectiveKind::all_gather].bytes_received, (d - 1) * B * V / d * f) << at;
    std::uint64_t calls = 0;
    for (const auto& e : t.total().by_kind) calls += e.calls;
    EXPECT_EQ(calls, 2 + 5 * L) << at;
  }
}

TEST(TspwDecoder, ASequencesLogitsDoNotDependOnItsBatchMatesInDouble) {
  const int D = 4, steps = 24;
  const ref::ModelConfig cfg = model_for(D);
  const Prompts prompts = prompts_for(cfg, 3);
  const auto w = ref::init_weights<double>(cfg, 19);
  const std::int64_t max_context = longest(prompts) + steps + 1;
  testing::expect_batch_independent(prompts, {0, 2}, [&](const Prompts& p) {
    return run_tspw<double>(tspw_shape(D, static_cast<int>(p.size()), max_context), w, p, steps);
  });
}

}  // namespace
}  // namespace tspemu::tsp

namespace tspemu::tsp {
namespace {

// ---------------------------------------------------------------- broken schedules

// RoPE at a token's index among its owner's keys instead of its global position (SGLang PR
// #32098's class of bug): the cache check names the first rank, layer, sequence and position
// whose key is wrong.
TEST(TspwFault, RopeWithLocalPositionsIsCaughtByTheCacheCheckNamingRankLayerSequencePosition) {
  const int D = 4, steps = 3;
  const ref::ModelConfig cfg = model_for(D);
  const Prompts prompts = prompts_for(cfg, 7);
  const int B = static_cast<int>(prompts.size());
  const DecodeShape s = tspw_shape(D, B, longest(prompts) + steps + 1);
  const auto w = ref::init_weights<double>(cfg, 13);
  ref::Sampler greedy = ref::Sampler::greedy();
  const auto oracle = ref::generate(w, prompts, steps + 1, greedy, s.max_context);
  const double max_mag = max_magnitude(oracle.cache);
  std::mutex m;
  std::vector<std::string> errors;
  auto inspect = [&](Rank& rank, const BasicTspwDecoder<double>& dec) {
    double worst = 0;
    const auto e = cache_mismatches(rank.id(), dec.cache(), oracle.cache, max_mag, worst);
    const std::lock_guard lock(m);
    errors.insert(errors.end(), e.begin(), e.end());
  };
  run_tspw<double>(s, w, prompts, steps, nullptr, inspect, TspwFault::rope_local_positions);
  ASSERT_FALSE(errors.empty()) << "the broken RoPE went unnoticed";
  EXPECT_THAT(errors.front(), AllOf(HasSubstr("rank "), HasSubstr(" layer "),
                                    HasSubstr(" sequence "), HasSubstr(" position ")));
  std::cout << errors.size() << " mismatches; first: " << errors.front() << "\n";
}

// A generated token's K/V stored by the rank after its owner: the cache refuses it, naming rank,
// layer, sequence and position, and the run fails instead of attending a misplaced key.
TEST(TspwFault, GeneratedKvWrittenToTheWrongOwnerFailsNamingRankLayerSequencePosition) {
  const int D = 3;
  const ref::ModelConfig cfg = model_for(D);
  const Prompts prompts = prompts_for(cfg, 7);
  const DecodeShape s = tspw_shape(D, static_cast<int>(prompts.size()), longest(prompts) + 4);
  const auto w = ref::init_weights<double>(cfg, 13);
  EXPECT_THAT(
      [&] { run_tspw<double>(s, w, prompts, 2, nullptr, {}, TspwFault::kv_wrong_owner); },
      ThrowsMessage<RankFailure>(AllOf(HasSubstr("layer 0 sequence "), HasSubstr(" position "),
                                       HasSubstr("is not this rank's to hold"))));
}

// One line per (rank, step, sequence) whose logits hold a value that is not finite.
template <class T>
std::vector<std::string> non_finite_logits(const std::vector<RankRun<T>>& runs, int B, int V) {
  std::vector<std::string> found;
  for (std::size_t r = 0; r < runs.size(); ++r)
    for (std::size_t step = 0; step < runs[r].logits.size(); ++step)
      for (int b = 0; b < B; ++b)
        for (int v = 0; v < V; ++v)
          if (!std::isfinite(
                  runs[r].logits[step][static_cast<std::size_t>(b) * static_cast<std::size_t>(V) +
                                       static_cast<std::size_t>(v)])) {
            found.push_back("rank " + std::to_string(r) + " step " + std::to_string(step) +
                            " sequence " + std::to_string(b));
            break;
          }
  return found;
}

// A rank holding no key of a sequence (prompt of length 1 < D) must contribute (0, -inf); NaN
// instead poisons that sequence's merge on its head owners, so its logits, and only its, are not
// finite on every rank from the prefill on. Fault-free, every logit is finite.
TEST(TspwFault, EmptyShardReturningNanIsCaughtNamingRankStepAndTheShortSequence) {
  const int D = 4;
  const ref::ModelConfig cfg = model_for(D);
  Prompts prompts = prompts_for(cfg, 9);
  prompts.resize(2);  // lengths 1 and 7: sequence 0 has keys on rank 0 only
  const int B = static_cast<int>(prompts.size());
  const DecodeShape s = tspw_shape(D, B, longest(prompts) + 2);
  const auto w = ref::init_weights<float>(cfg, 31);
  const std::vector<std::vector<std::int32_t>> feed(1, std::vector<std::int32_t>(2, 3));
  EXPECT_THAT(non_finite_logits(run_tspw<float>(s, w, prompts, 1, &feed), B, cfg.vocab),
              ::testing::IsEmpty());
  const auto found = non_finite_logits(
      run_tspw<float>(s, w, prompts, 1, &feed, {}, TspwFault::empty_shard_nan), B, cfg.vocab);
  std::vector<std::string> want;
  for (int r = 0; r < D; ++r)
    for (int step = 0; step < 2; ++step)
      want.push_back("rank " + std::to_string(r) + " step " + std::to_string(step) + " sequence 0");
  EXPECT_EQ(found, want);
}

// Seeded sampling on every rank of a TSP-W run, prefill then `steps` decode steps, each rank's
// sampler seeded by seed_of(rank) and each rank feeding its own picks: picks[rank][step] ([B]).
// The decoder returns logits and never samples, so ranks sampling independently is a fault of
// this loop (where sampling happens), not of the decoder.
std::vector<std::vector<std::vector<std::int32_t>>> sampled_picks(
    const DecodeShape& s, const ref::ModelWeights<float>& w, const Prompts& prompts, int steps,
    const std::function<std::uint64_t(int)>& seed_of) {
  std::vector<std::vector<std::vector<std::int32_t>>> picks(static_cast<std::size_t>(s.D));
  World world({.ranks = s.D});
  world.run([&](Rank& rank) {
    auto& mine = picks[static_cast<std::size_t>(rank.id())];
    TspwDecoder dec(rank, s, w);
    ref::Sampler sampler = ref::Sampler::seeded(seed_of(rank.id()), 1.0);
    std::vector<float> logits = dec.prefill(prompts);
    for (int step = 0; step <= steps; ++step) {
      mine.push_back(sampler.sample(std::span<const float>(logits), s.batch, s.model.vocab));
      if (step < steps) logits = dec.decode_step(mine.back());
    }
  });
  return picks;
}

// The every-rank-same-token check: one line per (rank, step) whose picks differ from rank 0's.
std::vector<std::string> token_disagreements(
    const std::vector<std::vector<std::vector<std::int32_t>>>& picks) {
  std::vector<std::string> found;
  for (std::size_t r = 1; r < picks.size(); ++r)
    for (std::size_t step = 0; step < picks[r].size(); ++step)
      if (picks[r][step] != picks[0][step])
        found.push_back("rank " + std::to_string(r) + " step " + std::to_string(step) +
                        ": picks differ from rank 0's");
  return found;
}

// Ranks sampling from their own random streams (vLLM's class of bug: a sampler seeded per rank)
// emit different tokens although their logits are bitwise equal; the check names the first rank
// and step that differ. With one stream (the same seed on every rank) every rank agrees.
TEST(TspwFault, RanksSamplingIndependentlyAreCaughtNamingRankAndStep) {
  const int D = 4, steps = 3;
  const ref::ModelConfig cfg = model_for(D);
  const Prompts prompts = prompts_for(cfg, 7);
  const DecodeShape s = tspw_shape(D, static_cast<int>(prompts.size()), longest(prompts) + steps);
  const auto w = ref::init_weights<float>(cfg, 37);
  EXPECT_THAT(token_disagreements(sampled_picks(s, w, prompts, steps, [](int) { return 5u; })),
              ::testing::IsEmpty());
  const auto found = token_disagreements(sampled_picks(
      s, w, prompts, steps, [](int r) { return 5u + static_cast<std::uint64_t>(r); }));
  ASSERT_FALSE(found.empty()) << "ranks sampling independently went unnoticed";
  EXPECT_THAT(found.front(), HasSubstr("rank 1 step 0: picks differ"));
  std::cout << found.size() << " disagreements; first: " << found.front() << "\n";
}

// A group mapping that hands ranks 0 and 1 each other's W_O shard (the o_proj bug issue 36
// cites): every rank still agrees, but the teacher-forced logits fail the oracle rule from the
// prefill on, naming the rank and step. Fault-free, every step passes (as TspwFloat checks at
// length).
TEST(TspwFault, OProjShardSwapIsCaughtByTheTeacherForcedLogitsNamingRankAndStep) {
  const int D = 4, steps = 3;
  const ref::ModelConfig cfg = model_for(D);
  const Prompts prompts = prompts_for(cfg);
  const DecodeShape s =
      tspw_shape(D, static_cast<int>(prompts.size()), longest(prompts) + steps + 1);
  const TeacherForced t = teacher_forced(s, prompts, steps);
  // One line per (rank, step) whose logits break the rule.
  auto failures = [&](TspwFault fault) {
    std::vector<std::string> found;
    const auto runs = run_tspw<float>(s, t.w32, prompts, steps, &t.feed, {}, fault);
    for (std::size_t r = 0; r < runs.size(); ++r)
      for (std::size_t i = 0; i < t.ref32.size(); ++i)
        if (const auto v = ref::check_close(
                "rank " + std::to_string(r) + " step " + std::to_string(i) + " logits",
                runs[r].logits[i], t.ref32[i], t.oracle.logits[i], kOracleFactor);
            !v)
          found.push_back(v.report);
    return found;
  };
  EXPECT_THAT(failures(TspwFault::none), ::testing::IsEmpty());
  const auto found = failures(TspwFault::o_proj_shard_swap);
  ASSERT_FALSE(found.empty()) << "the swapped o_proj shards went unnoticed";
  EXPECT_THAT(found.front(), HasSubstr("rank 0 step 0 logits"));
  EXPECT_EQ(found.size(), static_cast<std::size_t>(D * (steps + 1)))
      << "every rank's every step should fail; first: " << found.front();
  std::cout << found.size() << " failing (rank, step); first: " << found.front() << "\n";
}

}  // namespace
}  // namespace tspemu::tsp
