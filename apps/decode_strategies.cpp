#include <numeric>
#include <stdexcept>
#include <utility>
#include <vector>

#include "decode_session.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/kv_ownership.hpp"
#include "tspemu/tsp/tspw_decoder.hpp"

namespace tspemu::app {

namespace {

// 2·L·Σ_b S_b·NKV·hs·sizeof(float), S_b = P_b + N - 1: K and V of every layer and cached
// position (kv_cache.hpp); the last new token is sampled, never fed.
std::uint64_t whole_kv_bytes(const GenerateShape& s, std::span<const std::int64_t> prompt_lengths,
                             int new_tokens) {
  const std::int64_t positions =
      std::accumulate(prompt_lengths.begin(), prompt_lengths.end(), std::int64_t{0}) +
      static_cast<std::int64_t>(prompt_lengths.size()) * (new_tokens - 1);
  return 2 * static_cast<std::uint64_t>(s.model.n_layers) * static_cast<std::uint64_t>(positions) *
         static_cast<std::uint64_t>(s.model.kv_dim()) * sizeof(float);
}

// The reference decoder (reference/decode.hpp) on one rank: the whole cache, no collectives.
class ReferenceSession final : public DecodeSession {
 public:
  ReferenceSession(const ref::ModelWeights<float>& w, std::int64_t max_context)
      : w_(w), max_context_(max_context) {}
  std::vector<float> prefill(const std::vector<std::vector<std::int32_t>>& prompts) override {
    ref::Prefill<float> p = ref::prefill(w_, prompts, max_context_);
    cache_ = std::move(p.cache);
    return std::move(p.logits);
  }
  std::vector<float> decode_step(std::span<const std::int32_t> tokens) override {
    return ref::decode_step(w_, cache_, tokens);
  }
  std::uint64_t kv_cache_bytes() const override { return cache_.bytes(); }

 private:
  const ref::ModelWeights<float>& w_;
  std::int64_t max_context_;
  ref::KvCache<float> cache_;
};

DecodeStrategy reference_strategy() {
  return DecodeStrategy{
      .name = "reference",
      .description =
          "the single-thread reference decoder (reference/decode.hpp) on 1 rank, the "
          "whole KV cache",
      .why_invalid = [](const GenerateShape& s) -> std::string {
        return s.ranks == 1 ? "" : "the reference decoder runs on exactly 1 rank";
      },
      .make = [](Rank&, const GenerateShape& s,
                 const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<ReferenceSession>(w, s.max_context);
      },
      .kv_cache_bytes = [](const GenerateShape& s, std::span<const std::int64_t> prompt_lengths,
                           int new_tokens,
                           int) { return whole_kv_bytes(s, prompt_lengths, new_tokens); },
      .kv_formula = "2·L·Σ_b S_b·NKV·hs·4 with S_b = P_b + N - 1 (the whole cache)",
      // One rank: no collective.
      .decode_traffic = [](const GenerateShape&, std::span<const std::int64_t>, int,
                           int) { return TrafficCounters{}; },
  };
}

// TSP-W (tsp/tspw_decoder.hpp): TP-style projections on TSP's weight shards, attention over the
// sequence-sharded KV cache.
class TspwSession final : public DecodeSession {
 public:
  TspwSession(Rank& rank, const GenerateShape& s, const ref::ModelWeights<float>& w)
      : decoder_(rank, tspw_shape(s), w) {}
  static tsp::DecodeShape tspw_shape(const GenerateShape& s) {
    return tsp::DecodeShape{.model = s.model,
                            .D = s.ranks,
                            .batch = s.batch,
                            .max_context = s.max_context,
                            .interleave = s.interleave};
  }
  std::vector<float> prefill(const std::vector<std::vector<std::int32_t>>& prompts) override {
    return decoder_.prefill(prompts);
  }
  std::vector<float> decode_step(std::span<const std::int32_t> tokens) override {
    return decoder_.decode_step(tokens);
  }
  std::uint64_t kv_cache_bytes() const override { return decoder_.kv_cache_bytes(); }

 private:
  tsp::TspwDecoder decoder_;
};

// The planner's KV bytes per token and layer (plan/decode_cost.hpp) × L × the positions the
// ownership map gives the rank below max_context (each rank reserves them at prefill), rounded up
// to the arena's 64-byte granularity (rank_kv_cache.hpp).
std::uint64_t tspw_kv_bytes(const GenerateShape& s, std::span<const std::int64_t> prompt_lengths,
                            int rank) {
  const tsp::KvOwnership own(s.ranks, s.interleave, {prompt_lengths.begin(), prompt_lengths.end()});
  std::uint64_t positions = 0;
  for (int b = 0; b < s.batch; ++b)
    positions += static_cast<std::uint64_t>(own.count(rank, b, s.max_context));
  const tsp::cost::ModelShape m = tsp::cost::ModelShape::from(s.model, s.batch, s.max_context);
  const std::uint64_t bytes = static_cast<std::uint64_t>(s.model.n_layers) * positions *
                              tsp::cost::kv_bytes_per_token_layer(
                                  m, tsp::cost::DecodeStrategy::tsp_w(s.ranks), sizeof(float));
  return (bytes + 63) / 64 * 64;
}

// The planner's TSP-W decode step (plan/decode_cost.hpp; the K/V route an all-gather and the LSE
// packed with the partials, as the decoder runs them) for each of the N - 1 decode steps, the fed
// tokens' owners by the ownership map: step i feeds sequence b's position P_b + i - 1.
TrafficCounters tspw_decode_traffic(const GenerateShape& s,
                                    std::span<const std::int64_t> prompt_lengths, int new_tokens,
                                    int rank) {
  const tsp::KvOwnership own(s.ranks, s.interleave, {prompt_lengths.begin(), prompt_lengths.end()});
  const tsp::cost::ModelShape m = tsp::cost::ModelShape::from(s.model, s.batch, s.max_context);
  const tsp::cost::TspwDecodeOptions opt{.route = tsp::cost::KvRoute::all_gather};
  std::vector<int> owners(prompt_lengths.size());
  TrafficCounters t;
  for (int step = 1; step < new_tokens; ++step) {
    for (std::size_t b = 0; b < owners.size(); ++b)
      owners[b] = own.owner(static_cast<int>(b), prompt_lengths[b] + step - 1);
    t += tsp::cost::tspw_decode_step_traffic(m, s.ranks, owners, sizeof(float), rank, opt);
  }
  return t;
}

DecodeStrategy tspw_strategy() {
  return DecodeStrategy{
      .name = "tsp-w",
      .description =
          "TSP with weights in place: TP-style projections on TSP's weight shards, "
          "attention over the sequence-sharded KV cache by log-sum-exp merges "
          "(tsp/tspw_decoder.hpp)",
      .why_invalid = [](const GenerateShape& s) -> std::string {
        try {
          TspwSession::tspw_shape(s).validate();
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
        return "";
      },
      .make = [](Rank& rank, const GenerateShape& s, const ref::ModelWeights<float>& w)
          -> std::unique_ptr<DecodeSession> { return std::make_unique<TspwSession>(rank, s, w); },
      .kv_cache_bytes = [](const GenerateShape& s, std::span<const std::int64_t> prompt_lengths,
                           int, int rank) { return tspw_kv_bytes(s, prompt_lengths, rank); },
      .kv_formula =
          "round_up(L·kv_bytes_per_token_layer·Σ_b count(r, b, max_context), 64): the "
          "planner's bytes per token (plan/decode_cost.hpp) over the rank's reserved "
          "positions",
      .decode_traffic = tspw_decode_traffic,
  };
}

std::vector<DecodeStrategy> make_table() {
  return {reference_strategy(), tspw_strategy()};
}

}  // namespace

const std::vector<DecodeStrategy>& decode_strategies() {
  static const std::vector<DecodeStrategy> table = make_table();
  return table;
}

GenerateDefault generate_default() {
  return {"tsp-w", 4};
}

const DecodeStrategy* decode_strategy_named(const std::string& name) {
  for (const DecodeStrategy& s : decode_strategies())
    if (s.name == name) return &s;
  return nullptr;
}

std::string decode_strategy_names() {
  std::string names;
  for (const DecodeStrategy& s : decode_strategies()) names += (names.empty() ? "" : ", ") + s.name;
  return names;
}

}  // namespace tspemu::app
