// The checks the SP and TP+SP mesh decoders' tests share (tsp/sp_decoder.hpp,
// tsp/mesh_decoder.hpp), on top of decode_test_support.hpp: each rank's KV cache (its head shard
// of its row's positions) against the oracle's cache, each rank's KV bytes against the planner's
// closed form, every decode step's traffic, stage by stage on every rank, against the planner's
// decode_stage_traffic. Test-only.
//
// Bounds of the cache check (double): layer 0's K and V are the reference's bit for bit (the
//   embedding row is exact, the norm is the same per row, each K/V element is one dot product over
//   C of the same operands — a column shard of the reference's GEMM when T > 1 — and RoPE is at
//   the same global position); later layers see a residual whose attention output was merged over
//   Σ ranks by log-sum-exp and whose o_proj and down sums are split over T ranks, so they differ by
//   reordered double sums and a rescaling by exp(lse - LSE): <= 1e-13 of the largest magnitude
//   (kCacheRtol, the argument of tests/reference/decode_test.cpp's kCachedRtol; measured values are
//   printed by the tests, ~1e-15).
// Requirements: a decoder with cache() (a RankKvCache<double> whose rank() is the rank's row),
//   kv_cache_bytes() and last_traffic() (a MeshTraffic).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decode_test_support.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/kv_cache.hpp"
#include "tspemu/reference/sampling.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/kv_ownership.hpp"
#include "tspemu/tsp/mesh_decoder.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"

namespace tspemu::tsp::testing {

inline constexpr double kMeshCacheRtol = 1e-13;  // derived in the file comment

inline cost::DecodeStrategy strategy_of(const MeshDecodeShape& s) {
  return s.T == 1 ? cost::DecodeStrategy::sp(s.Sp) : cost::DecodeStrategy::tp_sp(s.T, s.Sp);
}

inline std::string label_of(const MeshDecodeShape& s) {
  return strategy_of(s).name();
}

inline std::vector<std::int64_t> lengths_of(const Prompts& prompts) {
  std::vector<std::int64_t> n;
  for (const auto& p : prompts) n.push_back(static_cast<std::int64_t>(p.size()));
  return n;
}

// World rank r's KV cache charge by the planner: its bytes per token and layer (the NKV/T heads
// it holds) × L × the positions its row owns below max_context, rounded up to the arena's 64
// bytes (planner_kv_cache_bytes: the reservation rank_kv_cache.hpp states).
inline std::uint64_t planned_kv_bytes(const MeshDecodeShape& s, const Prompts& prompts, int r,
                                      std::uint64_t beta) {
  const KvOwnership own(s.Sp, s.interleave, lengths_of(prompts));
  std::uint64_t tokens = 0;
  for (int b = 0; b < s.batch; ++b)
    tokens += static_cast<std::uint64_t>(own.count(r / s.T, b, s.max_context));
  const cost::ModelShape m = cost::ModelShape::from(s.model, s.batch, s.max_context);
  return planner_kv_cache_bytes(s.model.n_layers, tokens,
                                cost::kv_bytes_per_token_layer(m, strategy_of(s), beta));
}

// One line per position where world rank r's cache disagrees with the reference's: held by the
// wrong row, a count that is not the map's, or K/V of its KV heads [head0, head0 + kv.kv_heads())
// beyond the bound (layer 0 exact; later layers kMeshCacheRtol · max_mag). worst: the largest
// relative difference of layers >= 1.
inline std::vector<std::string> head_shard_cache_mismatches(int r, const RankKvCache<double>& kv,
                                                            int head0,
                                                            const ref::KvCache<double>& want,
                                                            double max_mag, double& worst) {
  std::vector<std::string> errors;
  const KvOwnership& own = kv.ownership();
  const std::size_t first = static_cast<std::size_t>(head0) * kv.head_size();
  for (int l = 0; l < want.n_layers(); ++l)
    for (int b = 0; b < want.batch(); ++b) {
      const std::string in = "rank " + std::to_string(r) + " (row " + std::to_string(kv.rank()) +
                             ") layer " + std::to_string(l) + " sequence " + std::to_string(b);
      for (std::int64_t p = 0; p < want.length(b); ++p) {
        const std::string at = in + " position " + std::to_string(p);
        const bool mine = own.owner(b, p) == kv.rank();
        if (kv.holds(l, b, p) != mine) {
          errors.push_back(at + ": held here " + std::to_string(kv.holds(l, b, p)) +
                           " but owned by row " + std::to_string(own.owner(b, p)));
          continue;
        }
        if (!mine) continue;
        for (const bool is_k : {true, false}) {
          const auto got = is_k ? kv.k(l, b, p) : kv.v(l, b, p);
          const auto ref_row = is_k ? want.k(l, b, p) : want.v(l, b, p);
          for (std::size_t i = 0; i < got.size(); ++i) {
            const double d = std::abs(got[i] - ref_row[first + i]);
            if (l > 0) worst = std::max(worst, d / max_mag);
            if ((l == 0 && d != 0) || d > kMeshCacheRtol * max_mag) {
              errors.push_back(at + (is_k ? " K[" : " V[") + std::to_string(first + i) +
                               "]: " + std::to_string(got[i]) + " vs reference " +
                               std::to_string(ref_row[first + i]));
              break;
            }
          }
        }
      }
      if (kv.held(l, b) != own.count(kv.rank(), b, want.length(b)))
        errors.push_back(in + ": holds " + std::to_string(kv.held(l, b)) + " positions, the map " +
                         std::to_string(own.count(kv.rank(), b, want.length(b))));
    }
  return errors;
}

// A 256-step greedy double run (run_greedy) of make(rank) on s.ranks() ranks, checked: tokens
// equal to the oracle's and every rank's logits rank 0's (expect_greedy_equals_oracle), every
// rank's cache against the oracle's (head_shard_cache_mismatches), every rank's KV bytes and
// arena kv_cache charge equal to planned_kv_bytes. Prints the worst cache difference.
template <class Make>
void expect_greedy_run_matches(const MeshDecodeShape& s, const ref::ModelWeights<double>& w,
                               const Prompts& prompts, Make&& make) {
  std::mutex m;
  std::vector<std::string> errors;
  double worst_all = 0;
  auto inspect = [&](Rank& rank, const auto& dec, const ref::Generation<double>& oracle) {
    double worst = 0;
    const int head0 = (rank.id() % s.T) * (s.model.n_kv_heads / s.T);
    const auto e = head_shard_cache_mismatches(rank.id(), dec.cache(), head0, oracle.cache,
                                               max_magnitude(oracle.cache), worst);
    const std::lock_guard lock(m);
    errors.insert(errors.end(), e.begin(), e.end());
    worst_all = std::max(worst_all, worst);
  };
  const auto g = run_greedy(s.ranks(), w, prompts, s.max_context, kGreedySteps,
                            std::forward<Make>(make), inspect);
  const std::string label = label_of(s);
  ASSERT_NO_FATAL_FAILURE(expect_greedy_equals_oracle(label, g, kGreedySteps));
  for (const std::string& e : errors) ADD_FAILURE() << label << ": " << e;
  for (int r = 0; r < s.ranks(); ++r) {
    const std::uint64_t want = planned_kv_bytes(s, prompts, r, sizeof(double));
    EXPECT_EQ(g.runs[static_cast<std::size_t>(r)].kv_cache_bytes, want) << label << " rank " << r;
    EXPECT_EQ(g.runs[static_cast<std::size_t>(r)].arena_kv_cache, want) << label << " rank " << r;
  }
  std::cout << label << ": " << kGreedySteps << " greedy double steps equal; KV cache, layers >= 1,"
            << " worst |decoder - reference| / max " << worst_all << " (layer 0 exact); "
            << g.runs[0].kv_cache_bytes << " B of KV on rank 0\n";
}

// The planner's name of each MeshTraffic stage (decode_cost's `what`).
inline std::vector<std::pair<std::string, const TrafficCounters*>> named_stages(
    const MeshTraffic& t) {
  return {{"embedding all-reduce", &t.embedding},
          {"LSE all-gather", &t.lse_gather},
          {"attention output all-reduce", &t.output_reduce},
          {"W_O all-reduce", &t.o_proj},
          {"MLP down all-reduce", &t.mlp},
          {"LM head logits all-gather", &t.lm_head}};
}

// One line per disagreement between a decoder's named stages and the planner's
// decode_stage_traffic, naming `at` (rank, step) and the stage: a planner stage the decoder does
// not measure, or measures differently; a decoder stage that moved something the planner does not
// have (an empty one may be absent: SP has no row stages).
inline void compare_stages(std::vector<std::string>& out, const std::string& at,
                           const std::vector<std::pair<std::string, const TrafficCounters*>>& mine,
                           const std::vector<cost::DecodeStageTraffic>& want) {
  auto describe = [](const TrafficCounters& c) {
    std::uint64_t calls = 0;
    for (const auto& e : c.by_kind) calls += e.calls;
    return "calls " + std::to_string(calls) + " sent " + std::to_string(c.total_sent()) +
           " received " + std::to_string(c.total_received());
  };
  for (const auto& w : want) {
    const TrafficCounters* got = nullptr;
    for (const auto& [what, counters] : mine)
      if (what == w.what) got = counters;
    if (got == nullptr)
      out.push_back(at + ": the decoder has no stage " + w.what);
    else if (!(*got == w.traffic))
      out.push_back(at + " stage " + w.what + ": " + describe(*got) + " vs planner " +
                    describe(w.traffic));
  }
  for (const auto& [what, counters] : mine) {
    bool planned = false;
    for (const auto& w : want) planned = planned || w.what == what;
    if (!planned && !(*counters == TrafficCounters{}))
      out.push_back(at + " stage " + what + ": " + describe(*counters) +
                    " but the planner has no such stage");
  }
}

// Every decode step of a float run (greedy, `steps` steps) of make(rank) (a float decoder) on
// s.ranks() ranks: each stage of last_traffic() on every rank equals decode_stage_traffic's, and
// the total decode_step_traffic's; each rank's KV bytes equal planned_kv_bytes (float).
template <class Make>
void expect_traffic_equals_planner(const MeshDecodeShape& s, const Prompts& prompts, int steps,
                                   Make&& make) {
  const cost::ModelShape m = cost::ModelShape::from(s.model, s.batch, s.max_context);
  const cost::DecodeStrategy st = strategy_of(s);
  constexpr std::uint64_t beta = sizeof(float);
  std::vector<std::vector<std::string>> findings(static_cast<std::size_t>(s.ranks()));
  std::vector<int> checked(static_cast<std::size_t>(s.ranks()), 0);
  World world({.ranks = s.ranks()});
  world.run([&](Rank& rank) {
    const int r = rank.id();
    auto& out = findings[static_cast<std::size_t>(r)];
    const auto dec = make(rank);
    std::vector<float> logits = dec->prefill(prompts);
    ref::Sampler greedy = ref::Sampler::greedy();
    const auto want = cost::decode_stage_traffic(m, st, s.batch, beta, r);
    for (int step = 0; step < steps; ++step) {
      logits =
          dec->decode_step(greedy.sample(std::span<const float>(logits), s.batch, s.model.vocab));
      const MeshTraffic& got = dec->last_traffic();
      const std::string at =
          label_of(s) + " rank " + std::to_string(r) + " step " + std::to_string(step);
      compare_stages(out, at, named_stages(got), want);
      if (!(got.total() == cost::decode_step_traffic(m, st, s.batch, beta, r)))
        out.push_back(at + ": total differs from decode_step_traffic");
      ++checked[static_cast<std::size_t>(r)];
    }
    if (dec->kv_cache_bytes() != planned_kv_bytes(s, prompts, r, beta))
      out.push_back(label_of(s) + " rank " + std::to_string(r) + " kv_cache_bytes " +
                    std::to_string(dec->kv_cache_bytes()) + " vs planner " +
                    std::to_string(planned_kv_bytes(s, prompts, r, beta)));
  });
  expect_no_findings(findings, checked, steps);
}

}  // namespace tspemu::tsp::testing
