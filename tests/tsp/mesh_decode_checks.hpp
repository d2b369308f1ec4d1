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

// World rank r's KV cache charge by the planner: the NKV/T heads it holds over the positions its
// row owns below max_context (planned_kv_bytes).
inline std::uint64_t planned_kv_bytes(const MeshDecodeShape& s, const Prompts& prompts, int r,
                                      std::uint64_t beta) {
  return planned_kv_bytes(s.model, strategy_of(s), prompts, s.max_context, s.Sp, s.interleave,
                          r / s.T, beta);
}

// A 256-step greedy double run of make(rank) on s.ranks() ranks, checked by judge_greedy_run:
// every rank's cache from its head shard's first KV head, KV bytes = planned_kv_bytes.
// layer0_exact: cache_mismatches' (false for a prefill whose ranks compute their own rows only).
template <class Make>
void expect_greedy_run_matches(const MeshDecodeShape& s, const ref::ModelWeights<double>& w,
                               const Prompts& prompts, Make&& make, bool layer0_exact = true) {
  judge_greedy_run(
      label_of(s), s.ranks(), w, prompts, s.max_context, kMeshCacheRtol, std::forward<Make>(make),
      [&s](Rank& rank, const auto& /*dec*/) {
        return (rank.id() % s.T) * (s.model.n_kv_heads / s.T);
      },
      [&](int r) { return planned_kv_bytes(s, prompts, r, sizeof(double)); }, layer0_exact);
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

// Every decode step of a float run (greedy, `steps` steps) of make(rank) on s.ranks() ranks
// against the planner (judge_decode_traffic): the stages named_stages, KV bytes planned_kv_bytes.
template <class Make>
void expect_traffic_equals_planner(const MeshDecodeShape& s, const Prompts& prompts, int steps,
                                   Make&& make) {
  judge_decode_traffic(
      label_of(s), s.ranks(), s.model, strategy_of(s), prompts, s.max_context, steps,
      std::forward<Make>(make), [&s](const MeshTraffic& t) { return named_stages(s, t); },
      [&](int r) { return planned_kv_bytes(s, prompts, r, sizeof(float)); });
}

}  // namespace tspemu::tsp::testing
