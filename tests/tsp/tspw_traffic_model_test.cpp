// TSP-W decoding (tspw_decoder.hpp) against the planner's closed forms (plan/decode_cost.hpp):
// every decode step's TrafficCounters of every stage, on every rank, equal
// tspw_decode_stage_traffic for the step's token owners (K/V route: all-gather, as implemented;
// LSE packed with the partials), and each rank's KV cache charge equals the planner's bytes per
// token and layer times the tokens the ownership map gives the rank below max_context, rounded up
// to the arena's 64 bytes (the one definition both sides state: rank_kv_cache.hpp's bytes()).
//
// Shapes: D = 2, 3, 4, 8 (GQA g = 2, L = 2, V = 96 so D | V); five prompts of lengths 1 (shorter
// than every D: ranks holding no key of it), 7, 13, 12, 16; five decode steps, so the new tokens'
// owners move between ranks. Compared with ==: both count bytes exactly (integers).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "decode_test_support.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/sampling.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/tspw_decoder.hpp"
#include "tspw_test_model.hpp"

namespace tspemu::tsp {
namespace {

constexpr int kTrafficSteps = 5;

// One rank's disagreements with the planner, one line each, naming rank, step and stage.
using Findings = std::vector<std::string>;

void compare_stage(Findings& out, const std::string& at, const char* stage,
                   const TrafficCounters& got, const TrafficCounters& want) {
  if (got == want) return;
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const auto& g = got.by_kind[k];
    const auto& w = want.by_kind[k];
    if (g == w) continue;
    out.push_back(at + " stage " + stage + " kind " + std::to_string(k) + ": calls " +
                  std::to_string(g.calls) + " sent " + std::to_string(g.bytes_sent) + " received " +
                  std::to_string(g.bytes_received) + " vs planner calls " +
                  std::to_string(w.calls) + " sent " + std::to_string(w.bytes_sent) + " received " +
                  std::to_string(w.bytes_received));
  }
}

class TspwTrafficModel : public ::testing::TestWithParam<int> {};

TEST_P(TspwTrafficModel, EveryStageOfEveryDecodeStepOnEveryRankEqualsThePlannersClosedForm) {
  const int D = GetParam();
  const ref::ModelConfig cfg = testing::tspw_test_model(D);
  std::mt19937 gen(11);
  std::vector<std::vector<std::int32_t>> prompts;
  for (const int len : {1, 7, 13, 12, 16}) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(len));
    for (auto& x : t) x = static_cast<std::int32_t>(gen() % static_cast<unsigned>(cfg.vocab));
    prompts.push_back(t);
  }
  const int B = static_cast<int>(prompts.size());
  DecodeShape s;
  s.model = cfg;
  s.D = D;
  s.batch = B;
  s.max_context = 16 + kTrafficSteps;
  s.interleave = D == 3 ? 3 : 1;
  const auto w = ref::init_weights<float>(cfg, 29);
  const cost::ModelShape m = cost::ModelShape::from(cfg, B, s.max_context);
  const cost::TspwDecodeOptions opt{.route = cost::KvRoute::all_gather};
  constexpr std::uint64_t beta = sizeof(float);

  std::vector<Findings> findings(static_cast<std::size_t>(D));
  std::vector<int> steps_checked(static_cast<std::size_t>(D), 0);
  World world({.ranks = D});
  world.run([&](Rank& rank) {
    const int r = rank.id();
    Findings& out = findings[static_cast<std::size_t>(r)];
    BasicTspwDecoder<float> dec(rank, s, w);
    std::vector<float> logits = dec.prefill(prompts);
    ref::Sampler greedy = ref::Sampler::greedy();
    for (int step = 0; step < kTrafficSteps; ++step) {
      std::vector<int> owners;
      owners.reserve(static_cast<std::size_t>(B));
      for (int b = 0; b < B; ++b) owners.push_back(dec.cache().ownership().owner(b, dec.length(b)));
      const auto next = greedy.sample(std::span<const float>(logits), B, cfg.vocab);
      logits = dec.decode_step(next);
      const TspwTraffic& got = dec.last_traffic();
      const cost::TspwStageTraffic want =
          cost::tspw_decode_stage_traffic(m, D, owners, beta, r, opt);
      const std::string at = "rank " + std::to_string(r) + " step " + std::to_string(step);
      compare_stage(out, at, "embedding", got.embedding, want.embedding);
      compare_stage(out, at, "kv_route", got.kv_route, want.kv_route);
      compare_stage(out, at, "q_gather", got.q_gather, want.q_gather);
      compare_stage(out, at, "partials", got.partials, want.partials);
      compare_stage(out, at, "o_proj", got.o_proj, want.o_proj);
      compare_stage(out, at, "mlp", got.mlp, want.mlp);
      compare_stage(out, at, "lm_head", got.lm_head, want.lm_head);
      if (!(got.total() == cost::tspw_decode_step_traffic(m, D, owners, beta, r, opt)))
        out.push_back(at + ": total differs from tspw_decode_step_traffic");
      ++steps_checked[static_cast<std::size_t>(r)];
    }
    // KV cache: the planner's bytes per token and layer × L × the rank's tokens below max_context.
    std::uint64_t tokens = 0;
    for (int b = 0; b < B; ++b)
      tokens += static_cast<std::uint64_t>(dec.cache().ownership().count(r, b, s.max_context));
    const std::uint64_t want_kv = testing::planner_kv_cache_bytes(
        cfg.n_layers, tokens,
        cost::kv_bytes_per_token_layer(m, cost::DecodeStrategy::tsp_w(D), beta));
    if (dec.kv_cache_bytes() != want_kv)
      out.push_back("rank " + std::to_string(r) + " kv_cache_bytes " +
                    std::to_string(dec.kv_cache_bytes()) + " vs planner " +
                    std::to_string(want_kv));
  });
  testing::expect_no_findings(findings, steps_checked, kTrafficSteps);
}

INSTANTIATE_TEST_SUITE_P(D, TspwTrafficModel, ::testing::Values(2, 3, 4, 8));

}  // namespace
}  // namespace tspemu::tsp
