#include <numeric>
#include <utility>

#include "decode_session.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/runtime/world.hpp"

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
  };
}

// ---- Parallel decode strategies register here. ----------------------------------------------
// TSP-W (tsp/tspw_decoder.hpp, branch tspw-decode) plugs in as one function beside
// reference_strategy(), `DecodeStrategy tspw_strategy()`: a DecodeSession forwarding to a
// tsp::TspwDecoder(rank, tsp::DecodeShape{model, D, batch, max_context, interleave}, master),
// why_invalid from DecodeShape::validate(), kv_cache_bytes the rank's reservation
// (rank_kv_cache.hpp: round_up(2·L·NKV·hs·4·Σ_b KvOwnership::count(r, b, max_context), 64));
// then append it to the table below and switch generate_default() to {"tsp-w", 4}.
std::vector<DecodeStrategy> make_table() {
  return {reference_strategy()};
}

}  // namespace

const std::vector<DecodeStrategy>& decode_strategies() {
  static const std::vector<DecodeStrategy> table = make_table();
  return table;
}

GenerateDefault generate_default() {
  // Issue 36's default is TSP-W on 4 ranks; it becomes {"tsp-w", 4} once tsp-w is in the table.
  return {"reference", 1};
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
