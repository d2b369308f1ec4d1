// What every parallel decoder's tests share, whatever the strategy: run a decoder on the ranks of
// a world and collect each rank's logits, judge teacher-forced float steps against the reference
// and the fp64 oracle under the project's rule, run and judge 256-step greedy double runs against
// the reference's tokens, and compare runs and ranks bit for bit; and the setups the decoders'
// tests share: the planner's KV bytes of a token shard, the refusals of bad shape values and of
// bad input, two runs compared, the 256-step greedy judge with each rank's cache and KV bytes
// (judge_greedy_run), and every decode step's stages against the planner (judge_decode_traffic).
// Test-only.
//
// Requirements: a per-rank decoder factory `make(Rank&) -> std::unique_ptr<Decoder>`, called once
//   per rank inside World::run, where Decoder has
//     std::vector<T> prefill(const Prompts&)                 logits [B, V]
//     std::vector<T> decode_step(std::span<const int32_t>)   logits [B, V]
//     std::size_t kv_cache_bytes() const
//   and optionally last_traffic() (its value after the last step is kept in RankRun::traffic).
//   The factory builds the decoder for the world's size (the caller's D, T or KVP × TP_A).
// Guarantees:
//   - the judges assert through gtest (EXPECT_*/ASSERT_*) and name the label, rank, step and
//     sequence of a failure; ASSERT-based ones (expect_greedy_equals_oracle) are meant to be
//     wrapped in ASSERT_NO_FATAL_FAILURE by a test that stops at their failure.
//   - the oracle is the double reference decoder (reference/decode.hpp), the float reference is
//     the same decoder on the float weights (the rule of reference/numerics.hpp).
// Cost: one reference and one parallel run per judge; greedy double runs of 256 steps take
//   seconds at the small test models.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "oracle_factor.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/model_config.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/sampling.hpp"
#include "tspemu/runtime/arena.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/kv_ownership.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"

namespace tspemu::tsp::testing {

using Prompts = std::vector<std::vector<std::int32_t>>;
using Feed = std::vector<std::vector<std::int32_t>>;  // [steps][B]

// Teacher-forced decode steps per float test, and the relative bound of a double KV cache's later
// layers against the reference cache (the file comments of tspw_decoder_test.cpp and
// tspm_decoder_test.cpp derive it; the other decoders' caches carry the same sums split over
// ranks).
inline constexpr int kForcedSteps = 24;
inline constexpr double kCacheRtol = 1e-13;
inline constexpr int kGreedySteps = 256;

// A small GQA test model (L = 2, F = V = 96, RoPE base 500) with NH query and NKV KV heads of
// size hidden / NH: the shapes of tspw_test_model.hpp with the KV heads chosen per test.
inline ref::ModelConfig small_gqa_model(int n_heads, int n_kv_heads, int hidden) {
  ref::ModelConfig c;
  c.vocab = 96;
  c.n_layers = 2;
  c.ffn = 96;
  c.rope_base = 500.0;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.hidden = hidden;
  return c;
}

// Five random prompts of lengths 1 (shorter than any degree: ranks without a key of it at
// first), 7 and 13 (prime), 12 and 16, ids in [0, vocab).
inline Prompts test_prompts(int vocab, unsigned seed) {
  std::mt19937 gen(seed);
  Prompts p;
  for (const int len : {1, 7, 13, 12, 16}) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(len));
    for (auto& x : t) x = static_cast<std::int32_t>(gen() % static_cast<unsigned>(vocab));
    p.push_back(t);
  }
  return p;
}

inline std::int64_t longest(const Prompts& p) {
  std::size_t n = 0;
  for (const auto& s : p) n = std::max(n, s.size());
  return static_cast<std::int64_t>(n);
}

// The largest |K| or |V| of a reference cache.
inline double max_magnitude(const ref::KvCache<double>& cache) {
  double max_mag = 0;
  for (int l = 0; l < cache.n_layers(); ++l)
    for (int b = 0; b < cache.batch(); ++b)
      for (std::int64_t p = 0; p < cache.length(b); ++p)
        for (const bool is_k : {true, false})
          for (const double x : is_k ? cache.k(l, b, p) : cache.v(l, b, p))
            max_mag = std::max(max_mag, std::abs(x));
  return max_mag;
}

// One line per position where a rank's cache disagrees with the reference cache `want`: held
// where its ownership map does not put it on this token shard (kv.rank()) or missing where it
// does, a held count other than the map's, or K/V of the rank's KV heads [first_head,
// first_head + kv.kv_heads()) beyond the bound: layer 0 exact (the same dot products over C, RoPE
// at the same global position), later layers rtol · max_mag (their residual carries sums split
// over ranks). Lines name `rank` (the world rank), layer, sequence and position. worst: the
// largest relative difference of layers >= 1. layer0_exact = false: layer 0 under the rtol bound
// too, and counted in worst (a decoder whose ranks compute row subsets of the reference's GEMMs,
// whose rows' rounding depends on the call's row count).
inline std::vector<std::string> cache_mismatches(int rank, const RankKvCache<double>& kv,
                                                 int first_head, const ref::KvCache<double>& want,
                                                 double max_mag, double rtol, double& worst,
                                                 bool layer0_exact = true) {
  std::vector<std::string> errors;
  const KvOwnership& own = kv.ownership();
  const std::size_t first =
      static_cast<std::size_t>(first_head) * static_cast<std::size_t>(kv.head_size());
  for (int l = 0; l < want.n_layers(); ++l)
    for (int b = 0; b < want.batch(); ++b) {
      for (std::int64_t p = 0; p < want.length(b); ++p) {
        const std::string at = "rank " + std::to_string(rank) + " layer " + std::to_string(l) +
                               " sequence " + std::to_string(b) + " position " + std::to_string(p);
        if (kv.holds(l, b, p) != (own.owner(b, p) == kv.rank())) {
          errors.push_back(at + ": held here " + std::to_string(kv.holds(l, b, p)) +
                           " but owned by token shard " + std::to_string(own.owner(b, p)));
          continue;
        }
        if (!kv.holds(l, b, p)) continue;
        for (const bool is_k : {true, false}) {
          const auto got = is_k ? kv.k(l, b, p) : kv.v(l, b, p);
          const auto ref_row = is_k ? want.k(l, b, p) : want.v(l, b, p);
          for (std::size_t i = 0; i < got.size(); ++i) {
            const double d = std::abs(got[i] - ref_row[first + i]);
            const bool exact = l == 0 && layer0_exact;
            if (!exact) worst = std::max(worst, d / max_mag);
            if ((exact && d != 0) || d > rtol * max_mag) {
              errors.push_back(at + (is_k ? " K[" : " V[") + std::to_string(i) +
                               "]: " + std::to_string(got[i]) + " vs reference " +
                               std::to_string(ref_row[first + i]));
              break;
            }
          }
        }
      }
      if (kv.held(l, b) != own.count(kv.rank(), b, want.length(b)))
        errors.push_back("rank " + std::to_string(rank) + " layer " + std::to_string(l) +
                         " holds " + std::to_string(kv.held(l, b)) + " positions of sequence " +
                         std::to_string(b));
    }
  return errors;
}

// The decoder a factory builds, and what its last_traffic() returns (std::monostate without one).
template <class Make>
using DecoderOf = typename std::invoke_result_t<Make&, Rank&>::element_type;

template <class Decoder>
struct TrafficOf {
  using type = std::monostate;
};
template <class Decoder>
requires requires(const Decoder& d) {
  d.last_traffic();
}
struct TrafficOf<Decoder> {
  using type = std::decay_t<decltype(std::declval<const Decoder&>().last_traffic())>;
};

// What one rank saw: the logits of the prefill and of every decode step ([steps + 1] of [B, V]).
template <class T, class Traffic = std::monostate>
struct RankRun {
  std::vector<std::vector<T>> logits;
  std::size_t kv_cache_bytes = 0;
  std::size_t arena_kv_cache = 0;
  Traffic traffic;  // of the last step
};

struct NoInspect {
  template <class... Args>
  void operator()(Args&&... /*unused*/) const {}
};

// Prefill, then `steps` decode steps on `ranks` ranks, each rank's decoder from make(rank).
// feed[i] ([B]) is fed at step i; without it, each rank feeds the greedy tokens of its own
// previous logits. `inspect(rank, decoder)` sees each rank's decoder at the end, inside the run.
template <class T, class Make, class Inspect = NoInspect>
auto run_decoder(int ranks, Make&& make, const Prompts& prompts, int steps,
                 const Feed* feed = nullptr, Inspect&& inspect = {}) {
  using Decoder = DecoderOf<Make>;
  using Run = RankRun<T, typename TrafficOf<Decoder>::type>;
  std::vector<Run> runs(static_cast<std::size_t>(ranks));
  const int B = static_cast<int>(prompts.size());
  World world({.ranks = ranks});
  world.run([&](Rank& rank) {
    Run& out = runs[static_cast<std::size_t>(rank.id())];
    const std::unique_ptr<Decoder> dec = make(rank);
    out.logits.push_back(dec->prefill(prompts));
    const int V = static_cast<int>(out.logits.back().size()) / B;
    ref::Sampler greedy = ref::Sampler::greedy();
    for (int i = 0; i < steps; ++i) {
      const std::vector<std::int32_t> next =
          feed ? (*feed)[static_cast<std::size_t>(i)]
               : greedy.sample(std::span<const T>(out.logits.back()), B, V);
      out.logits.push_back(dec->decode_step(next));
    }
    out.kv_cache_bytes = dec->kv_cache_bytes();
    out.arena_kv_cache =
        rank.arena().stats().category_current[static_cast<std::size_t>(Category::kv_cache)];
    if constexpr (!std::is_same_v<typename TrafficOf<Decoder>::type, std::monostate>)
      out.traffic = dec->last_traffic();
    inspect(rank, *dec);
  });
  return runs;
}

// The greedy tokens of every step's logits: [steps + 1][B].
template <class T>
std::vector<std::vector<std::int32_t>> greedy_tokens(const std::vector<std::vector<T>>& logits,
                                                     int B, int V) {
  ref::Sampler greedy = ref::Sampler::greedy();
  std::vector<std::vector<std::int32_t>> t;
  t.reserve(logits.size());
  for (const auto& l : logits) t.push_back(greedy.sample(std::span<const T>(l), B, V));
  return t;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Rank r's logits of `step` are rank 0's, bit for bit.
template <class T, class Traffic>
::testing::AssertionResult rank_logits_equal(const std::vector<RankRun<T, Traffic>>& runs,
                                             std::size_t r, std::size_t step) {
  if (bitwise_equal(runs[r].logits[step], runs[0].logits[step]))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "rank " << r << " step " << step << ": logits differ from rank 0's";
}

// Every step's logits of every rank are rank 0's, bit for bit (stops at the first difference).
template <class T, class Traffic>
void expect_every_rank_equal(const std::vector<RankRun<T, Traffic>>& runs) {
  for (std::size_t r = 1; r < runs.size(); ++r)
    for (std::size_t i = 0; i < runs[0].logits.size(); ++i)
      ASSERT_TRUE(rank_logits_equal(runs, r, i));
}

// Two runs' logits on rank 0 are bitwise identical, step by step (stops at the first difference).
template <class T, class Traffic>
void expect_bitwise_identical(const std::vector<RankRun<T, Traffic>>& a,
                              const std::vector<RankRun<T, Traffic>>& b) {
  ASSERT_EQ(a[0].logits.size(), b[0].logits.size());
  for (std::size_t i = 0; i < a[0].logits.size(); ++i)
    ASSERT_TRUE(bitwise_equal(a[0].logits[i], b[0].logits[i])) << "step " << i;
}

// The oracle of a greedy run: the double reference's generate of steps + 1 tokens per sequence.
inline ref::Generation<double> greedy_oracle(const ref::ModelWeights<double>& w,
                                             const Prompts& prompts, std::int64_t max_context,
                                             int steps) {
  ref::Sampler greedy = ref::Sampler::greedy();
  return ref::generate(w, prompts, steps + 1, greedy, max_context);
}

// A teacher-forced run's inputs: the oracle's greedy run of steps + 1 tokens (the double
// reference on w64) picks what every side is fed; ref32 holds the float reference's logits (on
// w32) of the prefill and of each fed step.
struct ForcedInputs {
  ref::Generation<double> oracle;
  Feed feed;                              // [steps][B]
  std::vector<std::vector<float>> ref32;  // [steps + 1][B·V]
};

inline ForcedInputs teacher_forced_inputs(const ref::ModelWeights<double>& w64,
                                          const ref::ModelWeights<float>& w32,
                                          const Prompts& prompts, std::int64_t max_context,
                                          int steps) {
  const std::size_t B = prompts.size();
  ForcedInputs in;
  in.oracle = greedy_oracle(w64, prompts, max_context, steps);
  in.feed.assign(static_cast<std::size_t>(steps), std::vector<std::int32_t>(B));
  for (std::size_t i = 0; i < in.feed.size(); ++i)
    for (std::size_t b = 0; b < B; ++b) in.feed[i][b] = in.oracle.tokens[b][i];
  auto pre = ref::prefill(w32, prompts, max_context);
  in.ref32.push_back(pre.logits);
  for (const auto& t : in.feed) in.ref32.push_back(ref::decode_step(w32, pre.cache, t));
  return in;
}

// The teacher-forced judge: on teacher_forced_inputs, every step's float logits of the parallel
// decoder (make(rank) on `ranks` ranks, fed the same tokens) pass err(parallel fp32) <=
// factor·err(reference fp32) + tiny against the double reference, and every rank's logits equal
// rank 0's bit for bit. Returns the worst err(parallel)/err(reference) over the steps (for the
// test's report).
struct ForcedResult {
  double worst_ratio = 0;
  std::size_t steps = 0;  // logits judged: the prefill's and every decode step's
};

template <class Make>
ForcedResult judge_teacher_forced(const std::string& label, int ranks,
                                  const ref::ModelWeights<double>& w64,
                                  const ref::ModelWeights<float>& w32, const Prompts& prompts,
                                  std::int64_t max_context, int steps, Make&& make,
                                  double factor = kOracleFactor) {
  const auto [oracle, feed, ref32] = teacher_forced_inputs(w64, w32, prompts, max_context, steps);
  const auto runs = run_decoder<float>(ranks, std::forward<Make>(make), prompts, steps, &feed);
  ForcedResult result;
  result.steps = ref32.size();
  for (std::size_t i = 0; i < ref32.size(); ++i) {
    const auto v = ref::check_close(label + " step " + std::to_string(i) + " logits",
                                    runs[0].logits[i], ref32[i], oracle.logits[i], factor);
    EXPECT_TRUE(v) << v.report;
    if (v.reference.max_abs > 0)
      result.worst_ratio = std::max(result.worst_ratio, v.candidate.max_abs / v.reference.max_abs);
    for (std::size_t r = 1; r < runs.size(); ++r) EXPECT_TRUE(rank_logits_equal(runs, r, i));
  }
  return result;
}

// A free-running greedy double run of `steps` decode steps and its oracle, for the greedy judge.
template <class Traffic>
struct GreedyRun {
  ref::Generation<double> oracle;
  std::vector<RankRun<double, Traffic>> runs;
};

// The oracle (greedy_oracle), then the parallel run of make(rank) on `ranks` ranks. inspect is
// called inside the run as inspect(rank, decoder, oracle), so it can compare each rank's cache
// with oracle.cache.
template <class Make, class Inspect = NoInspect>
auto run_greedy(int ranks, const ref::ModelWeights<double>& w, const Prompts& prompts,
                std::int64_t max_context, int steps, Make&& make, Inspect&& inspect = {}) {
  GreedyRun<typename TrafficOf<DecoderOf<Make>>::type> g;
  g.oracle = greedy_oracle(w, prompts, max_context, steps);
  g.runs = run_decoder<double>(ranks, std::forward<Make>(make), prompts, steps, nullptr,
                               [&](Rank& rank, const auto& dec) { inspect(rank, dec, g.oracle); });
  return g;
}

// The greedy judge: rank 0's greedy tokens of every step equal the oracle's, and every rank's
// logits equal rank 0's bit for bit. Fatal failures; wrap in ASSERT_NO_FATAL_FAILURE.
template <class Traffic>
void expect_greedy_equals_oracle(const std::string& label, const GreedyRun<Traffic>& g, int steps) {
  const int B = static_cast<int>(g.oracle.tokens.size());
  const int V = static_cast<int>(g.runs[0].logits[0].size()) / B;
  const auto tokens = greedy_tokens(g.runs[0].logits, B, V);
  ASSERT_EQ(tokens.size(), static_cast<std::size_t>(steps + 1));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    for (int b = 0; b < B; ++b)
      ASSERT_EQ(tokens[i][static_cast<std::size_t>(b)],
                g.oracle.tokens[static_cast<std::size_t>(b)][i])
          << label << " step " << i << " sequence " << b;
  expect_every_rank_equal(g.runs);
}

// A sequence's logits do not depend on its batch-mates: for each b in `which`, a run of prompt b
// alone gives, bit for bit, the slice b of the batch run's logits at every step. run(prompts)
// returns the runs of one decoder setup for those prompts (its batch is prompts.size()).
template <class RunFn>
void expect_batch_independent(const Prompts& prompts, const std::vector<int>& which, RunFn&& run) {
  const auto batch = run(prompts);
  const std::size_t V = batch[0].logits[0].size() / prompts.size();
  for (const int b : which) {
    const Prompts alone{prompts[static_cast<std::size_t>(b)]};
    const auto single = run(alone);
    for (std::size_t i = 0; i < single[0].logits.size(); ++i)
      ASSERT_EQ(std::memcmp(single[0].logits[i].data(),
                            batch[0].logits[i].data() + static_cast<std::size_t>(b) * V,
                            V * sizeof(single[0].logits[i][0])),
                0)
          << "sequence " << b << " step " << i;
  }
}

// The input checks every decoder makes before computing anything, on one rank's decoder `dec`
// of batch 2, V = 96, max_context 8 (each thrown message names `who`, the sequence, position and
// value): decode before prefill, an empty prompt, a token outside [0, V), a prompt or a decode
// step past max_context. Leaves dec prefilled with prompts of 7 and 1 tokens and one step
// decoded.
template <class Decoder>
void expect_bad_input_refused(Decoder& dec, const std::string& who) {
  using ::testing::HasSubstr;
  using ::testing::ThrowsMessage;
  const std::vector<std::int32_t> two{1, 2};
  EXPECT_THAT([&] { dec.decode_step(two); }, ThrowsMessage<std::invalid_argument>(
                                                 HasSubstr(who + ": decode_step before prefill")));
  EXPECT_THAT(
      [&] {
        dec.prefill({{1, 2}, {}});
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("sequence 1 is empty")));
  EXPECT_THAT(
      [&] {
        dec.prefill({{1, 96}, {3}});
      },
      ThrowsMessage<std::invalid_argument>(
          HasSubstr("sequence 0 position 1 has token 96 outside [0, 96)")));
  EXPECT_THAT(
      [&] {
        dec.prefill({{1}, {1, 2, 3, 4, 5, 6, 7, 8, 9}});
      },
      ThrowsMessage<std::length_error>(HasSubstr("max_context=8")));
  dec.prefill({{1, 2, 3, 4, 5, 6, 7}, {4}});
  const std::vector<std::int32_t> bad{1, -1};
  EXPECT_THAT([&] { dec.decode_step(bad); }, ThrowsMessage<std::invalid_argument>(
                                                 HasSubstr("sequence 1 position 1 has token -1")));
  dec.decode_step(two);  // sequence 0 now holds positions 0..7
  EXPECT_THAT([&] { dec.decode_step(two); },
              ThrowsMessage<std::length_error>(HasSubstr("sequence 0 would hold position 8")));
}

// A rank's KV cache reservation by the planner: L × tokens × bytes per token and layer
// (plan/decode_cost.hpp's kv_bytes_per_token_layer), rounded up to the arena's 64 bytes
// (rank_kv_cache.hpp's bytes()).
inline std::uint64_t planner_kv_cache_bytes(int layers, std::uint64_t tokens,
                                            std::uint64_t bytes_per_token_layer) {
  constexpr std::uint64_t kArenaGranularity = 64;
  const std::uint64_t raw = static_cast<std::uint64_t>(layers) * tokens * bytes_per_token_layer;
  return (raw + kArenaGranularity - 1) / kArenaGranularity * kArenaGranularity;
}

// Per-rank findings of a run (one line each, naming rank and step) become test failures, and
// every rank checked `steps` steps.
inline void expect_no_findings(const std::vector<std::vector<std::string>>& findings,
                               const std::vector<int>& checked, int steps) {
  for (std::size_t r = 0; r < findings.size(); ++r) {
    EXPECT_EQ(checked[r], steps) << "rank " << r;
    for (const std::string& f : findings[r]) ADD_FAILURE() << f;
  }
}

// One decode step of a mesh decoder (TP, Helix) against the planner on one rank, one line per
// disagreement, each starting with `at`: every stage of the decoder's, named as the planner's
// decode_stage_traffic entries, equal to the planner's stage of that name; as many stages as the
// planner's; the decoder's total equal to decode_step_traffic (`want_total`).
inline std::vector<std::string> stage_findings(
    const std::string& at, const std::vector<std::pair<std::string, const TrafficCounters*>>& mine,
    const TrafficCounters& total, const std::vector<cost::DecodeStageTraffic>& want,
    const TrafficCounters& want_total) {
  std::vector<std::string> out;
  if (want.size() != mine.size())
    out.push_back(at + ": the planner has " + std::to_string(want.size()) + " stages");
  for (const auto& [what, counters] : mine) {
    bool found = false;
    for (const auto& stage : want)
      if (stage.what == what) {
        found = true;
        if (!(stage.traffic == *counters))
          out.push_back(at + " stage " + what + ": received " +
                        std::to_string(counters->total_received()) + " sent " +
                        std::to_string(counters->total_sent()) + " vs planner " +
                        std::to_string(stage.traffic.total_received()) + " / " +
                        std::to_string(stage.traffic.total_sent()));
      }
    if (!found) out.push_back(at + ": the planner has no stage " + what);
  }
  if (!(total == want_total)) out.push_back(at + ": total differs from decode_step_traffic");
  return out;
}

// The prompts' lengths.
inline std::vector<std::int64_t> lengths_of(const Prompts& prompts) {
  std::vector<std::int64_t> n;
  for (const auto& p : prompts) n.push_back(static_cast<std::int64_t>(p.size()));
  return n;
}

// A rank's KV cache charge by the planner: token shard `shard` of KvOwnership(shards, interleave,
// the prompts' lengths) reserves its positions below max_context of every sequence, at the
// planner's bytes per token and layer for `strategy` (planner_kv_cache_bytes). One token shard
// (TP): B · max_context positions.
inline std::uint64_t planned_kv_bytes(const ref::ModelConfig& cfg,
                                      const cost::DecodeStrategy& strategy, const Prompts& prompts,
                                      std::int64_t max_context, int shards, int interleave,
                                      int shard, std::uint64_t beta) {
  const KvOwnership own(shards, interleave, lengths_of(prompts));
  std::uint64_t tokens = 0;
  for (int b = 0; b < own.batch(); ++b)
    tokens += static_cast<std::uint64_t>(own.count(shard, b, max_context));
  const cost::ModelShape ms =
      cost::ModelShape::from(cfg, static_cast<int>(prompts.size()), max_context);
  return planner_kv_cache_bytes(cfg.n_layers, tokens,
                                cost::kv_bytes_per_token_layer(ms, strategy, beta));
}

// A shape with one bad value, and what its refusal must name besides the decoder's name.
template <class Shape>
struct BadValue {
  std::function<void(Shape&)> set;
  std::string named;
};

// The bad values every decoder's shape refuses: B = 0, max_context = 0, I = 0.
template <class Shape>
std::vector<BadValue<Shape>> common_bad_values() {
  return {{[](Shape& s) { s.batch = 0; }, "B=0"},
          {[](Shape& s) { s.max_context = 0; }, "max_context=0"},
          {[](Shape& s) { s.interleave = 0; }, "I=0"}};
}

// Each bad value applied to a copy of `good`: validate(copy) throws std::invalid_argument whose
// message names `who` and the value.
template <class Shape, class Validate>
void expect_bad_values_refused(const std::string& who, const Shape& good, Validate&& validate,
                               const std::vector<BadValue<Shape>>& bad) {
  using ::testing::AllOf;
  using ::testing::HasSubstr;
  for (const BadValue<Shape>& b : bad) {
    Shape s = good;
    b.set(s);
    EXPECT_THAT([&] { validate(s); }, ::testing::ThrowsMessage<std::invalid_argument>(
                                          AllOf(HasSubstr(who), HasSubstr(b.named))));
  }
}

// expect_bad_input_refused on every rank's decoder make(rank) of a world of `ranks` (batch 2,
// V = 96, max_context 8), after a prefill of one prompt for that batch of two is refused naming
// both counts.
template <class Make>
void expect_decoder_refuses_bad_input(int ranks, Make&& make, const std::string& who) {
  World world({.ranks = ranks});
  world.run([&](Rank& rank) {
    const auto dec = make(rank);
    EXPECT_THAT(
        [&] {
          dec->prefill({{1, 2}});
        },
        ::testing::ThrowsMessage<std::invalid_argument>(::testing::AllOf(
            ::testing::HasSubstr(who), ::testing::HasSubstr("1 prompts for batch B=2"))));
    expect_bad_input_refused(*dec, who);
  });
}

// Two float runs of make(rank) on `ranks` ranks (prefill, then `steps` greedy steps) give the same
// logits bit for bit, and every rank's logits are rank 0's.
template <class Make>
void expect_deterministic(int ranks, const Make& make, const Prompts& prompts, int steps) {
  const auto a = run_decoder<float>(ranks, make, prompts, steps);
  const auto b = run_decoder<float>(ranks, make, prompts, steps);
  expect_bitwise_identical(a, b);
  expect_every_rank_equal(a);
}

// The greedy judge with the cache and the KV bytes: the oracle and a double run of kGreedySteps
// free-running greedy steps of make(rank) on `ranks` ranks (run_greedy); rank 0's tokens equal to
// the oracle's and every rank's logits rank 0's (expect_greedy_equals_oracle, fatal); every
// rank's cache against the oracle's from KV head first_head(rank, decoder) on (cache_mismatches,
// bound rtol; layer0_exact as cache_mismatches'); every rank's kv_cache_bytes and arena
// kv_cache charge equal to want_kv(r). Prints the worst cache difference of the layers compared
// by rtol and rank 0's KV bytes. Every failure names `label`.
template <class Make, class FirstHead, class KvBytes>
void judge_greedy_run(const std::string& label, int ranks, const ref::ModelWeights<double>& w,
                      const Prompts& prompts, std::int64_t max_context, double rtol, Make&& make,
                      FirstHead&& first_head, KvBytes&& want_kv, bool layer0_exact = true) {
  std::mutex m;
  std::vector<std::string> errors;
  double worst_all = 0;
  auto inspect = [&](Rank& rank, const auto& dec, const ref::Generation<double>& oracle) {
    double worst = 0;
    const auto e = cache_mismatches(rank.id(), dec.cache(), first_head(rank, dec), oracle.cache,
                                    max_magnitude(oracle.cache), rtol, worst, layer0_exact);
    const std::lock_guard lock(m);
    errors.insert(errors.end(), e.begin(), e.end());
    worst_all = std::max(worst_all, worst);
  };
  const auto g =
      run_greedy(ranks, w, prompts, max_context, kGreedySteps, std::forward<Make>(make), inspect);
  ASSERT_NO_FATAL_FAILURE(expect_greedy_equals_oracle(label, g, kGreedySteps));
  for (const std::string& e : errors) ADD_FAILURE() << label << ": " << e;
  for (int r = 0; r < ranks; ++r) {
    const std::uint64_t want = want_kv(r);
    EXPECT_EQ(g.runs[static_cast<std::size_t>(r)].kv_cache_bytes, want) << label << " rank " << r;
    EXPECT_EQ(g.runs[static_cast<std::size_t>(r)].arena_kv_cache, want) << label << " rank " << r;
  }
  std::cout << label << ": " << kGreedySteps << " greedy double steps equal; KV cache, "
            << (layer0_exact ? "layers >= 1" : "all layers")
            << ", worst |decoder - reference| / max " << worst_all
            << (layer0_exact ? " (layer 0 exact); " : "; ") << g.runs[0].kv_cache_bytes
            << " B of KV on rank 0\n";
}

// Every decode step of a float greedy run (`steps` steps after the prefill) of make(rank) on
// `ranks` ranks against the planner's closed forms for `strategy`: on every rank r, the stages
// named(last_traffic()) (pairs of the planner's stage name and the decoder's counters) equal
// decode_stage_traffic's and the total decode_step_traffic's (stage_findings), and
// kv_cache_bytes() equals want_kv(r). One failure per finding, naming the label, rank and step.
template <class Make, class Named, class KvBytes>
void judge_decode_traffic(const std::string& label, int ranks, const ref::ModelConfig& cfg,
                          const cost::DecodeStrategy& strategy, const Prompts& prompts,
                          std::int64_t max_context, int steps, Make&& make, Named&& named,
                          KvBytes&& want_kv) {
  const int B = static_cast<int>(prompts.size());
  const cost::ModelShape ms = cost::ModelShape::from(cfg, B, max_context);
  constexpr std::uint64_t beta = sizeof(float);
  std::vector<std::vector<std::string>> findings(static_cast<std::size_t>(ranks));
  std::vector<int> checked(static_cast<std::size_t>(ranks), 0);
  World world({.ranks = ranks});
  world.run([&](Rank& rank) {
    const int r = rank.id();
    auto& out = findings[static_cast<std::size_t>(r)];
    const auto dec = make(rank);
    std::vector<float> logits = dec->prefill(prompts);
    ref::Sampler greedy = ref::Sampler::greedy();
    const auto want = cost::decode_stage_traffic(ms, strategy, B, beta, r);
    for (int step = 0; step < steps; ++step) {
      logits = dec->decode_step(greedy.sample(std::span<const float>(logits), B, cfg.vocab));
      const auto& got = dec->last_traffic();
      const std::string at = label + " rank " + std::to_string(r) + " step " + std::to_string(step);
      const auto f = stage_findings(at, named(got), got.total(), want,
                                    cost::decode_step_traffic(ms, strategy, B, beta, r));
      out.insert(out.end(), f.begin(), f.end());
      ++checked[static_cast<std::size_t>(r)];
    }
    const std::uint64_t want_bytes = want_kv(r);
    if (dec->kv_cache_bytes() != want_bytes)
      out.push_back(label + " rank " + std::to_string(r) + " kv_cache_bytes " +
                    std::to_string(dec->kv_cache_bytes()) + " vs planner " +
                    std::to_string(want_bytes));
  });
  expect_no_findings(findings, checked, steps);
}

}  // namespace tspemu::tsp::testing
