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
//   (kMeshCacheRtol, the argument of tests/reference/decode_test.cpp's kCachedRtol; measured values
//   are printed by the tests, ~1e-15).
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

// A 256-step greedy double run (run_greedy) of make(rank) on s.ranks() ranks, checked: tokens
// equal to the oracle's and every rank's logits rank 0's (expect_greedy_equals_oracle), every
// rank's cache, its head shard, against the oracle's (cache_mismatches), every rank's KV bytes and
// arena kv_cache charge equal to planned_kv_bytes. Prints the worst cache difference.
// layer0_exact: cache_mismatches' (false for a prefill whose ranks compute their own rows only).
template <class Make>
void expect_greedy_run_matches(const MeshDecodeShape& s, const ref::ModelWeights<double>& w,
                               const Prompts& prompts, Make&& make, bool layer0_exact = true) {
  std::mutex m;
  std::vector<std::string> errors;
  double worst_all = 0;
  auto inspect = [&](Rank& rank, const auto& dec, const ref::Generation<double>& oracle) {
    double worst = 0;
    const int head0 = (rank.id() % s.T) * (s.model.n_kv_heads / s.T);
    const auto e =
        cache_mismatches(rank.id(), dec.cache(), head0, oracle.cache, max_magnitude(oracle.cache),
                         kMeshCacheRtol, worst, layer0_exact);
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
  std::cout << label << ": " << kGreedySteps << " greedy double steps equal; KV cache, "
            << (layer0_exact ? "layers >= 1" : "all layers")
            << ", worst |decoder - reference| / max " << worst_all
            << (layer0_exact ? " (layer 0 exact); " : "; ") << g.runs[0].kv_cache_bytes
            << " B of KV on rank 0\n";
}

// The stages a mesh decoder of shape s has, under the planner's names (decode_cost's `what`): the
// row's four when T > 1, the column's two when Σ > 1.
inline std::vector<std::pair<std::string, const TrafficCounters*>> named_stages(
    const MeshDecodeShape& s, const MeshTraffic& t) {
  std::vector<std::pair<std::string, const TrafficCounters*>> v;
  if (s.T > 1)
    v.insert(v.end(), {{"W_O all-reduce", &t.o_proj},
                       {"MLP down all-reduce", &t.mlp},
                       {"embedding all-reduce", &t.embedding},
                       {"LM head logits all-gather", &t.lm_head}});
  if (s.Sp > 1)
    v.insert(v.end(), {{"LSE all-gather", &t.lse_gather},
                       {"attention output all-reduce", &t.output_reduce}});
  return v;
}

// Every decode step of a float run (greedy, `steps` steps) of make(rank) (a float decoder) on
// s.ranks() ranks: each stage of last_traffic() on every rank equals decode_stage_traffic's, and
// the total decode_step_traffic's (stage_findings); each rank's KV bytes equal planned_kv_bytes
// (float).
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
      const auto f = stage_findings(at, named_stages(s, got), got.total(), want,
                                    cost::decode_step_traffic(m, st, s.batch, beta, r));
      out.insert(out.end(), f.begin(), f.end());
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
