#include <algorithm>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "decode_session.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/helix_decoder.hpp"
#include "tspemu/tsp/kv_ownership.hpp"
#include "tspemu/tsp/megatron_sp_decoder.hpp"
#include "tspemu/tsp/mesh_decoder.hpp"
#include "tspemu/tsp/sp_decoder.hpp"
#include "tspemu/tsp/tp_decoder.hpp"
#include "tspemu/tsp/tspm_decoder.hpp"
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

// The decoder shape of a GenerateShape: D is the world's ranks (TSP-W's D, TP's T).
tsp::DecodeShape decode_shape(const GenerateShape& s) {
  return tsp::DecodeShape{.model = s.model,
                          .D = s.ranks,
                          .batch = s.batch,
                          .max_context = s.max_context,
                          .interleave = s.interleave};
}

// "" when validate accepts the shape, else its message.
std::string refusal(const std::function<void(const tsp::DecodeShape&)>& validate,
                    const GenerateShape& s) {
  try {
    validate(decode_shape(s));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// A session over one of the tsp decoders (same calls, float): TSP-W (tsp/tspw_decoder.hpp), TSP-M
// (tsp/tspm_decoder.hpp), TP (tsp/tp_decoder.hpp), Helix (tsp/helix_decoder.hpp), SP
// (tsp/sp_decoder.hpp), TP+SP (tsp/mesh_decoder.hpp).
template <class Decoder>
class DecoderSession final : public DecodeSession {
 public:
  // The decoder's constructor arguments: (rank, decode_shape(s)[, its own], weights).
  template <class... Args>
  explicit DecoderSession(Args&&... args) : decoder_(std::forward<Args>(args)...) {}
  std::vector<float> prefill(const std::vector<std::vector<std::int32_t>>& prompts) override {
    return decoder_.prefill(prompts);
  }
  std::vector<float> decode_step(std::span<const std::int32_t> tokens) override {
    return decoder_.decode_step(tokens);
  }
  std::uint64_t kv_cache_bytes() const override { return decoder_.kv_cache_bytes(); }

 private:
  Decoder decoder_;
};

// The planner's KV bytes per token and layer (plan/decode_cost.hpp) of strategy `st` × L × the
// positions an ownership map over `shards` token shards gives shard `shard` below max_context
// (each rank reserves them at prefill), rounded up to the arena's 64-byte granularity
// (rank_kv_cache.hpp).
std::uint64_t sharded_kv_bytes(const GenerateShape& s, std::span<const std::int64_t> prompt_lengths,
                               int shards, int shard, const tsp::cost::DecodeStrategy& st) {
  const tsp::KvOwnership own(shards, s.interleave, {prompt_lengths.begin(), prompt_lengths.end()});
  std::uint64_t positions = 0;
  for (int b = 0; b < s.batch; ++b)
    positions += static_cast<std::uint64_t>(own.count(shard, b, s.max_context));
  const tsp::cost::ModelShape m = tsp::cost::ModelShape::from(s.model, s.batch, s.max_context);
  const std::uint64_t bytes = static_cast<std::uint64_t>(s.model.n_layers) * positions *
                              tsp::cost::kv_bytes_per_token_layer(m, st, sizeof(float));
  return (bytes + 63) / 64 * 64;
}

// The planner's traffic of the N - 1 decode steps of a schedule whose step depends on which rank
// owns each fed token (TSP-W, TSP-M): step(m, owners) for each step, the owners by the ownership
// map over the ranks: step i feeds sequence b's position P_b + i - 1.
TrafficCounters owned_decode_traffic(
    const GenerateShape& s, std::span<const std::int64_t> prompt_lengths, int new_tokens,
    const std::function<TrafficCounters(const tsp::cost::ModelShape&, const std::vector<int>&)>&
        step) {
  const tsp::KvOwnership own(s.ranks, s.interleave, {prompt_lengths.begin(), prompt_lengths.end()});
  const tsp::cost::ModelShape m = tsp::cost::ModelShape::from(s.model, s.batch, s.max_context);
  std::vector<int> owners(prompt_lengths.size());
  TrafficCounters t;
  for (int i = 1; i < new_tokens; ++i) {
    for (std::size_t b = 0; b < owners.size(); ++b)
      owners[b] = own.owner(static_cast<int>(b), prompt_lengths[b] + i - 1);
    t += step(m, owners);
  }
  return t;
}

// TSP-W's decode step (tspw_decode_step_traffic; the K/V route an all-gather and the LSE packed
// with the partials, as the decoder runs them).
TrafficCounters tspw_decode_traffic(const GenerateShape& s,
                                    std::span<const std::int64_t> prompt_lengths, int new_tokens,
                                    int rank) {
  const tsp::cost::TspwDecodeOptions opt{.route = tsp::cost::KvRoute::all_gather};
  return owned_decode_traffic(s, prompt_lengths, new_tokens,
                              [&](const tsp::cost::ModelShape& m, const std::vector<int>& owners) {
                                return tsp::cost::tspw_decode_step_traffic(
                                    m, s.ranks, owners, sizeof(float), rank, opt);
                              });
}

// TSP-M's decode step (tspm_decode_stage_traffic: broadcasts, ring hops, gathers and exchanges
// by the fed tokens' owners), all stages.
TrafficCounters tspm_decode_traffic(const GenerateShape& s,
                                    std::span<const std::int64_t> prompt_lengths, int new_tokens,
                                    int rank) {
  return owned_decode_traffic(s, prompt_lengths, new_tokens,
                              [&](const tsp::cost::ModelShape& m, const std::vector<int>& owners) {
                                return tsp::cost::tspm_decode_stage_traffic(m, s.ranks, owners,
                                                                            sizeof(float), rank)
                                    .total();
                              });
}

// The planner's decode step of a mesh schedule (decode_step_traffic: TP, Helix, SP, TP+SP; the
// same for every step of B tokens, whoever owns them) over the N - 1 decode steps.
TrafficCounters mesh_decode_traffic(const GenerateShape& s, const tsp::cost::DecodeStrategy& st,
                                    int new_tokens, int rank) {
  const tsp::cost::ModelShape m = tsp::cost::ModelShape::from(s.model, s.batch, s.max_context);
  const TrafficCounters step = tsp::cost::decode_step_traffic(m, st, s.batch, sizeof(float), rank);
  TrafficCounters t;
  for (int i = 1; i < new_tokens; ++i) t += step;
  return t;
}

DecodeStrategy tspw_strategy() {
  return DecodeStrategy{
      .name = "tsp-w",
      .description =
          "TSP with weights in place: TP-style projections on TSP's weight shards, "
          "attention over the sequence-sharded KV cache by log-sum-exp merges "
          "(tsp/tspw_decoder.hpp)",
      .why_invalid =
          [](const GenerateShape& s) {
            return refusal([](const tsp::DecodeShape& d) { d.validate(); }, s);
          },
      .make = [](Rank& rank, const GenerateShape& s,
                 const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<DecoderSession<tsp::TspwDecoder>>(rank, decode_shape(s), w);
      },
      .kv_cache_bytes =
          [](const GenerateShape& s, std::span<const std::int64_t> prompt_lengths, int, int rank) {
            return sharded_kv_bytes(s, prompt_lengths, s.ranks, rank,
                                    tsp::cost::DecodeStrategy::tsp_w(s.ranks));
          },
      .kv_formula =
          "round_up(L·kv_bytes_per_token_layer·Σ_b count(r, b, max_context), 64): the "
          "planner's bytes per token (plan/decode_cost.hpp) over the rank's reserved "
          "positions",
      .decode_traffic = tspw_decode_traffic,
  };
}

DecodeStrategy tspm_strategy() {
  return DecodeStrategy{
      .name = "tsp-m",
      .description =
          "TSP with weights moving, as in training: the weight shards broadcast and ringed every "
          "step, each token's K/V kept by its owner, attention merged by log-sum-exp "
          "(tsp/tspm_decoder.hpp)",
      .why_invalid = [](const GenerateShape& s) { return refusal(tsp::TspmDecoder::validate, s); },
      .make = [](Rank& rank, const GenerateShape& s,
                 const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<DecoderSession<tsp::TspmDecoder>>(rank, decode_shape(s), w);
      },
      .kv_cache_bytes =
          [](const GenerateShape& s, std::span<const std::int64_t> prompt_lengths, int, int rank) {
            return sharded_kv_bytes(s, prompt_lengths, s.ranks, rank,
                                    tsp::cost::DecodeStrategy::tsp_m(s.ranks));
          },
      .kv_formula =
          "round_up(L·kv_bytes_per_token_layer·Σ_b count(r, b, max_context), 64): the "
          "planner's bytes per token (plan/decode_cost.hpp) over the rank's reserved "
          "positions",
      .decode_traffic = tspm_decode_traffic,
  };
}

// TP (tsp/tp_decoder.hpp): every rank caches every position of its KV heads, reserved at
// prefill for max_context positions: the planner's bytes per token and layer × L × B·max_context,
// rounded up to the arena's 64 bytes.
std::uint64_t tp_kv_bytes(const GenerateShape& s) {
  const tsp::cost::ModelShape m = tsp::cost::ModelShape::from(s.model, s.batch, s.max_context);
  const std::uint64_t bytes =
      static_cast<std::uint64_t>(s.model.n_layers) * static_cast<std::uint64_t>(s.batch) *
      static_cast<std::uint64_t>(s.max_context) *
      tsp::cost::kv_bytes_per_token_layer(m, tsp::cost::DecodeStrategy::tp(s.ranks), sizeof(float));
  return (bytes + 63) / 64 * 64;
}

DecodeStrategy tp_strategy() {
  return DecodeStrategy{
      .name = "tp",
      .description =
          "Megatron tensor parallelism on T = --ranks: head-sharded projections and KV cache, "
          "every position on every rank; past T = NKV each KV head is duplicated T/NKV times "
          "(tsp/tp_decoder.hpp)",
      .why_invalid = [](const GenerateShape& s) { return refusal(tsp::validate_tp, s); },
      .make = [](Rank& rank, const GenerateShape& s,
                 const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<DecoderSession<tsp::TpDecoder>>(rank, decode_shape(s), w);
      },
      .kv_cache_bytes = [](const GenerateShape& s, std::span<const std::int64_t>, int,
                           int) { return tp_kv_bytes(s); },
      .kv_formula =
          "round_up(L·kv_bytes_per_token_layer·B·max_context, 64): the planner's bytes per "
          "token (plan/decode_cost.hpp, max(NKV/T, 1) KV heads) over every reserved position",
      .decode_traffic =
          [](const GenerateShape& s, std::span<const std::int64_t>, int new_tokens, int rank) {
            return mesh_decode_traffic(s, tsp::cost::DecodeStrategy::tp(s.ranks), new_tokens, rank);
          },
  };
}

// Helix's split of N = --ranks (no flag of its own): TP_A = gcd(N/2, NKV), KVP = N / TP_A, so
// KVP >= 2 whenever N >= 2 and TP_A divides NKV (no KV duplication); N = 1 is 1 × 1.
int helix_kvp(const GenerateShape& s) {
  const int tpa = s.ranks >= 2 ? std::gcd(s.ranks / 2, s.model.n_kv_heads) : 1;
  return s.ranks / std::max(tpa, 1);
}

DecodeStrategy helix_strategy() {
  return DecodeStrategy{
      .name = "helix",
      .description =
          "Helix on N = --ranks = KVP x TP_A with TP_A = gcd(N/2, NKV): attention head-sharded "
          "over TP_A and KV-sharded over the sequence across KVP (log-sum-exp merge), W_O, "
          "MLP and vocabulary TP over all N (tsp/helix_decoder.hpp)",
      .why_invalid =
          [](const GenerateShape& s) {
            return refusal(
                [&s](const tsp::DecodeShape& d) { tsp::validate_helix(d, helix_kvp(s)); }, s);
          },
      .make = [](Rank& rank, const GenerateShape& s,
                 const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<DecoderSession<tsp::HelixDecoder>>(rank, decode_shape(s),
                                                                   helix_kvp(s), w);
      },
      .kv_cache_bytes =
          [](const GenerateShape& s, std::span<const std::int64_t> prompt_lengths, int, int rank) {
            const int kvp = helix_kvp(s), tpa = s.ranks / kvp;
            return sharded_kv_bytes(s, prompt_lengths, kvp, rank / tpa,
                                    tsp::cost::DecodeStrategy::helix(kvp, tpa));
          },
      .kv_formula =
          "round_up(L·kv_bytes_per_token_layer·Σ_b count(k, b, max_context), 64), k = rank / "
          "TP_A: the planner's bytes per token (plan/decode_cost.hpp, max(NKV/TP_A, 1) KV heads) "
          "over the token shard's reserved positions",
      .decode_traffic =
          [](const GenerateShape& s, std::span<const std::int64_t>, int new_tokens, int rank) {
            const int kvp = helix_kvp(s);
            return mesh_decode_traffic(s, tsp::cost::DecodeStrategy::helix(kvp, s.ranks / kvp),
                                       new_tokens, rank);
          },
  };
}

DecodeStrategy megatron_sp_strategy() {
  return DecodeStrategy{
      .name = "megatron-sp",
      .description =
          "Megatron TP with sequence parallelism on T = --ranks: TP's weights and KV cache, the "
          "residual stream sharded over each step's token rows (padded to a multiple of T), "
          "all-gather before and reduce-scatter after each TP block "
          "(tsp/megatron_sp_decoder.hpp)",
      .why_invalid = [](const GenerateShape& s) { return refusal(tsp::validate_megatron_sp, s); },
      .make = [](Rank& rank, const GenerateShape& s,
                 const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<DecoderSession<tsp::MegatronSpDecoder>>(rank, decode_shape(s), w);
      },
      .kv_cache_bytes = [](const GenerateShape& s, std::span<const std::int64_t>, int,
                           int) { return tp_kv_bytes(s); },
      .kv_formula =
          "round_up(L·kv_bytes_per_token_layer·B·max_context, 64): TP's cache, the planner's "
          "bytes per token (max(NKV/T, 1) KV heads) over every reserved position",
      .decode_traffic =
          [](const GenerateShape& s, std::span<const std::int64_t>, int new_tokens, int rank) {
            return mesh_decode_traffic(s, tsp::cost::DecodeStrategy::megatron_sp(s.ranks),
                                       new_tokens, rank);
          },
  };
}

// ---- SP / context parallel and the TP+SP mesh (tsp/sp_decoder.hpp, tsp/mesh_decoder.hpp) -----

// SP with a ring pass-KV or Ulysses prefill (tsp/sp_decoder.hpp's SpPrefill), pass-Q decode.
DecodeStrategy sp_prefill_strategy(tsp::SpPrefill prefill) {
  const bool ring = prefill == tsp::SpPrefill::ring;
  return DecodeStrategy{
      .name = ring ? "sp-ring" : "sp-ulysses",
      .description =
          ring ? "SP as `sp`, the prompts prefilled by ring attention (pass-KV): each rank "
                 "computes its own prompt tokens, K/V blocks go round the ring "
                 "(tsp/sp_decoder.hpp)"
               : "SP as `sp`, the prompts prefilled by Ulysses: each rank computes its own prompt "
                 "tokens, all-to-all sequence<->heads around the attention; needs --ranks to "
                 "divide the heads and KV heads (tsp/sp_decoder.hpp)",
      .why_invalid =
          [prefill](const GenerateShape& s) {
            return refusal(
                [prefill](const tsp::DecodeShape& d) { tsp::validate_sp_prefill(d, prefill); }, s);
          },
      .make = [prefill](Rank& rank, const GenerateShape& s,
                        const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<DecoderSession<tsp::SpDecoder>>(rank, decode_shape(s), w, prefill);
      },
      .kv_cache_bytes =
          [](const GenerateShape& s, std::span<const std::int64_t> prompt_lengths, int, int rank) {
            return sharded_kv_bytes(s, prompt_lengths, s.ranks, rank,
                                    tsp::cost::DecodeStrategy::sp(s.ranks));
          },
      .kv_formula =
          "round_up(L·kv_bytes_per_token_layer·Σ_b count(r, b, max_context), 64) over Σ = "
          "--ranks: the planner's bytes per token (all NKV heads) over the rank's reserved "
          "positions, the prefill leaving each rank its own prompt tokens' K/V",
      .decode_traffic =
          [](const GenerateShape& s, std::span<const std::int64_t>, int new_tokens, int rank) {
            return mesh_decode_traffic(s, tsp::cost::DecodeStrategy::sp(s.ranks), new_tokens, rank);
          },
  };
}

DecodeStrategy sp_strategy() {
  return DecodeStrategy{
      .name = "sp",
      .description =
          "SP / context parallel on Σ = --ranks ranks: weights replicated, the KV cache "
          "sharded over the sequence, pass-Q attention merged by an LSE all-gather and an "
          "all-reduce (tsp/sp_decoder.hpp)",
      .why_invalid = [](const GenerateShape& s) { return refusal(tsp::validate_sp, s); },
      .make = [](Rank& rank, const GenerateShape& s,
                 const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<DecoderSession<tsp::SpDecoder>>(rank, decode_shape(s), w);
      },
      .kv_cache_bytes =
          [](const GenerateShape& s, std::span<const std::int64_t> prompt_lengths, int, int rank) {
            return sharded_kv_bytes(s, prompt_lengths, s.ranks, rank,
                                    tsp::cost::DecodeStrategy::sp(s.ranks));
          },
      .kv_formula =
          "round_up(L·kv_bytes_per_token_layer·Σ_b count(r, b, max_context), 64) over Σ = "
          "--ranks: the planner's bytes per token (all NKV heads) over the rank's reserved "
          "positions",
      .decode_traffic =
          [](const GenerateShape& s, std::span<const std::int64_t>, int new_tokens, int rank) {
            return mesh_decode_traffic(s, tsp::cost::DecodeStrategy::sp(s.ranks), new_tokens, rank);
          },
  };
}

// TP+SP on D = --ranks = T × Σ ranks. The rule for T: the smallest divisor of D in (1, D) that
// divides NH, NKV, F and V (each rank of a row holds whole heads, MLP columns and vocabulary
// rows), so Σ = D / T is the largest SP degree a true mesh (T, Σ >= 2) allows;
// std::invalid_argument when there is none.
tsp::MeshDecodeShape tp_sp_shape(const tsp::DecodeShape& d) {
  const ref::ModelConfig& m = d.model;
  for (int t = 2; t < d.D; ++t)
    if (d.D % t == 0 && m.n_heads % t == 0 && m.n_kv_heads % t == 0 && m.ffn % t == 0 &&
        m.vocab % t == 0) {
      tsp::MeshDecodeShape ms{.model = m,
                              .T = t,
                              .Sp = d.D / t,
                              .batch = d.batch,
                              .max_context = d.max_context,
                              .interleave = d.interleave};
      ms.validate();
      return ms;
    }
  throw std::invalid_argument(
      "TP+SP decode: no T in (1, " + std::to_string(d.D) + ") divides the ranks " +
      std::to_string(d.D) + " and NH=" + std::to_string(m.n_heads) +
      ", NKV=" + std::to_string(m.n_kv_heads) + ", F=" + std::to_string(m.ffn) +
      ", V=" + std::to_string(m.vocab) + " (a T × Σ mesh with T, Σ >= 2)");
}

DecodeStrategy tp_sp_strategy() {
  return DecodeStrategy{
      .name = "tp-sp",
      .description =
          "the TP+SP mesh on --ranks = T × Σ ranks, T the smallest divisor > 1 of --ranks "
          "dividing the heads, KV heads, MLP width and vocabulary: TP over each row, SP pass-Q "
          "over each column on the row's head shard (tsp/mesh_decoder.hpp)",
      .why_invalid =
          [](const GenerateShape& s) {
            return refusal([](const tsp::DecodeShape& d) { (void)tp_sp_shape(d); }, s);
          },
      .make = [](Rank& rank, const GenerateShape& s,
                 const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<DecoderSession<tsp::MeshDecoder>>(rank,
                                                                  tp_sp_shape(decode_shape(s)), w);
      },
      .kv_cache_bytes =
          [](const GenerateShape& s, std::span<const std::int64_t> prompt_lengths, int, int rank) {
            const tsp::MeshDecodeShape ms = tp_sp_shape(decode_shape(s));
            return sharded_kv_bytes(s, prompt_lengths, ms.Sp, rank / ms.T,
                                    tsp::cost::DecodeStrategy::tp_sp(ms.T, ms.Sp));
          },
      .kv_formula =
          "round_up(L·kv_bytes_per_token_layer·Σ_b count(row, b, max_context), 64) over Σ, "
          "row = rank / T: the planner's bytes per token (NKV/T heads) over the row's reserved "
          "positions",
      .decode_traffic =
          [](const GenerateShape& s, std::span<const std::int64_t>, int new_tokens, int rank) {
            const tsp::MeshDecodeShape ms = tp_sp_shape(decode_shape(s));
            return mesh_decode_traffic(s, tsp::cost::DecodeStrategy::tp_sp(ms.T, ms.Sp), new_tokens,
                                       rank);
          },
  };
}

std::vector<DecodeStrategy> make_table() {
  return {reference_strategy(),
          tspw_strategy(),
          tspm_strategy(),
          tp_strategy(),
          megatron_sp_strategy(),
          helix_strategy(),
          sp_strategy(),
          sp_prefill_strategy(tsp::SpPrefill::ring),
          sp_prefill_strategy(tsp::SpPrefill::ulysses),
          tp_sp_strategy()};
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
