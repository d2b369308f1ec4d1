// Decode (and prefill) cost model of the inference schedules: per rank, the weights, the KV cache
// of a batch, the bytes of every collective of one decode step, the HBM bytes one step reads and
// the longest context a memory budget holds. A plain library in the leaf module plan/, beside the
// training closed forms (cost_model.hpp, whose ModelShape and ring conventions it uses).
//
// What
//   Schedules (DecodeScheme): TP (T), Megatron-SP (T: TP with the residual stream sharded over the
//   step's token rows), SP / context parallel (Σ, pass-Q decode, weights replicated; its prefill
//   pass-Q, ring pass-KV or Ulysses: sp_prefill_stage_traffic), the TP+SP mesh (T × Σ), Helix
//   (KVP × TP_A on the same N ranks), TSP-M and TSP-W (D). Notation as ../shared/INFERENCE-NOTES.md
//   §1.4: h hidden, L layers, n_h / n_kv heads, d = h / n_h, g = n_h / n_kv, F = ffn / h, β bytes
//   per element, B new tokens (one per sequence), S_b the cached tokens of sequence b that the step
//   attends to (its new token included).
//
// The schedules as modelled (one decode step; per layer unless said; "AR" all-reduce):
//   TP (T)        hidden state replicated; column W_Q/K/V, gate/up, row W_O, down; 2 AR of [B, h]
//                 over T. Each rank holds max(n_kv/T, 1) KV heads: past T = n_kv the KV heads
//                 (W_K/W_V columns and cache) are duplicated T/n_kv times. Vocabulary-parallel
//                 embedding (AR of [B, h]) and LM head (all-gather of [B, V/T]) once per step.
//   Megatron-SP (T)  TP with sequence parallelism: the step's token rows padded to Np =
//                 ceil(N/T)·T and cut into T contiguous pieces; norms and residual on a rank's
//                 Np/T rows; all-gather [Np, h] before the column-parallel W_Q/K/V and gate/up,
//                 reduce-scatter of the row-parallel W_O and down outputs; embedding reduce-
//                 scattered, LM head input all-gathered, then TP's logits all-gather of [B, V/T].
//                 Weights and cache as TP's. 4 collectives per layer, (T−1)/T·Np·h·β each.
//   SP (Σ)        weights replicated, every rank computes Q/K/V of the B new tokens redundantly
//                 (the new token's K/V is kept by its owner: no traffic); partial attention over
//                 the local S/Σ keys; merge: all-gather of the partials' LSE (B·n_h fp32 per
//                 rank) then an AR of the rescaled outputs [B, h]. 2 collectives (1 + LSE).
//   TP+SP (T×Σ)   TP over each row of T, SP over each column of Σ on the head shard: 2 AR of
//                 [B, h] over T, AR of [B, h/T] and the LSE all-gather (B·n_h/T) over Σ.
//   Helix (KVP×TP_A = N)  attention: W_Q/K/V split over TP_A (replicated over KVP), partial
//                 attention over the local S/KVP keys, all-to-all over KVP of the [B, h/TP_A]
//                 partials and their LSE to the head owners; W_O row-parallel over all N and
//                 AR of [B, h] over N; dense FFN over N and AR of [B, h] over N. Vocabulary over N.
//   TSP-M (D)     the training loop: D broadcasts of the packed attention shards (root rotating),
//                 D−1 ring hops of the MLP shards; per head shard the owners' queries all-gathered
//                 and the partials (+ LSE) sent back to the token owners (all-to-all). The token's
//                 owner computes every shard's K/V for its token: no routing. Embedding and LM head
//                 as in training: D broadcasts of each vocabulary shard per step, each (tied: the
//                 embedding's shards twice); then an all-gather of the owners' [B, V] logits
//                 (every rank samples). Runtime: tsp/tspm_decoder.hpp, counted by
//                 tspm_step_stage_traffic (the Q all-gather an all_gatherv, the partials
//                 point-to-point: the same bytes summed over the ranks).
//   TSP-W (D)     weights in place (TSP's shards are Megatron's): rank r computes Q/K/V of head
//                 shard r for the B new tokens; routes each new token's K/V head slice to the
//                 token's cache owner (send/recv, or optionally an all-gather); all-gathers Q;
//                 partial attention over its local keys for all heads; all-to-all of (out, LSE)
//                 partials to the head owners; row-parallel W_O + AR of [B, h]; MLP column/row
//                 + AR of [B, h]. Embedding via vocabulary-sharded rows (AR of [B, h]), LM head
//                 all-gather of [B, V/D] logits. 5 collectives per layer (4 without the route).
//
// Formulas as pinned (ring convention, bytes per device per layer, β per element; LSE fp32, 4 B;
// the notes' table states the same unless marked *):
//   TP      4(T−1)/T·B·h·β
//   Megatron-SP  4(T−1)/T·ceil(B/T)·T·h·β   (TP's volume when T | B)
//   SP      2(Σ−1)/Σ·B·h·β            + LSE (Σ−1)·B·n_h·4 *
//   TP+SP   4(T−1)/T·B·h·β + 2(Σ−1)/Σ·B·(h/T)·β  + LSE (Σ−1)·B·(n_h/T)·4 *
//   Helix   (KVP−1)/KVP·B·(h/TP_A)·β + 4(N−1)/N·B·h·β  + LSE (KVP−1)/KVP·B·(n_h/TP_A)·4
//   TSP-M   (D−1)/D·[P_attn + P_mlp + 2·B·h]·β  + LSE (D−1)/D·B·n_h·4
//   TSP-W   (D−1)/D·B·h·(6 + 2/(g·D))·β         + LSE (D−1)/D·B·n_h·4
//   * SP's and the mesh's LSE are all-gathers, so every rank receives Σ−1 blocks: (Σ−1)·B·n_h,
//     not the notes' generic "(D−1)/D·B·n_h" (which is the all-to-all's of TSP-W and Helix).
//   The notes' worked numbers (§1.5) exclude the LSE term; comm_per_step() does too, lse_per_step()
//   gives it apart.
//   Weights per rank per layer (elements; norms 2h replicated everywhere):
//     TP, TP+SP  (W_Q + W_O)/T + (W_K + W_V)·max(n_kv/T, 1)/n_kv + P_mlp/T
//     SP         P_attn + P_mlp
//     Helix      (W_Q)/TP_A + (W_K + W_V)·max(n_kv/TP_A, 1)/n_kv + W_O/N + P_mlp/N *
//     TSP-M/W    (P_attn + P_mlp)/D  (TSP-M adds one attention and one MLP shard in flight)
//   * the notes' table writes P_attn/TP_A: after Helix's all-to-all each rank holds n_h/N heads
//     of the attention output, so W_O is row-parallel over all N (it is what makes the following
//     all-reduce over N correct), and only W_Q/K/V are split over TP_A.
//   KV cache per rank per layer: 2·d·β·(KV heads held)·Σ_b ceil(S_b / token shards), with
//     KV heads held: TP, TP+SP max(n_kv/T, 1); Helix max(n_kv/TP_A, 1); SP, TSP all n_kv;
//     token shards: TP 1; SP, TP+SP Σ; Helix KVP; TSP D. ceil: the most loaded rank of a balanced
//     layout; exact for every rank when the shards divide S_b.
//   HBM bytes read per step per rank: the weights the rank's GEMMs read (TSP-M: every shard
//     passes through every rank, so all of P, not P/D) + its KV cache.
//   S_max for a budget M per device (B = 1): shards · floor((M − weights − buffers) / (2·L·d·β·
//     KV heads held)), the tokens a sequence spreads over its token shards.
//   Prefill per layer per device (ring convention, the training forward): TSP (D−1)/D·[(2 + 2/g
//     + 3F)h² + 2·B·S·h/g], TP 4(T−1)/T·B·S·h; with g = 1, F = 4, D = T, TSP < TP iff B·S > 8h.
//
// Where this differs from INFERENCE-NOTES.md §1.4 (each re-derived from the schedule above):
//   - SP's and TP+SP's LSE term (all-gathers, see *), Helix's W_O over N (see *);
//   - HBM reads of TSP-M: P per step, not P/D (the notes' weights/rank + KV/rank holds for the
//     others);
//   - TSP-M's collectives per layer: 4D − 1 calls (D broadcasts, D − 1 hops, D Q all-gathers, D
//     partial all-to-alls, the LSE riding with them), where the notes count ≈ 2D (the weights');
//   - the notes' 1.43 MB (TSP-W), 0.46 MB (SP8), 0.72 MB (TP2×SP4) per step exclude the LSE; with
//     it they are 1.44, 0.49 and 0.73 MB;
//   - the notes' P (8.59 B parameters of the 7B-class model) is the layers' only: the S_max and
//     weights per rank they print hold for the layers, not with the 32000-row vocabulary, which
//     decode_cost adds (ceil(V/n) rows per rank).
//
// Requirements (std::invalid_argument naming the schedule and values): degrees >= 1; TP, TP+SP
//   T | n_h, T | ffn, and T | n_kv (T <= n_kv) or n_kv | T (T > n_kv); Helix the same for TP_A,
//   and N | n_h, N | ffn; TSP D | n_h, D | kv_dim (TSP's column split), D | ffn. Vocabulary rows
//   are split in ceil(V / n) (padded, as Megatron pads its vocabulary).
// Guarantees: bytes are exact integers (uint64) wherever the convention gives an integer; the
//   ring-convention per-device figures are doubles ((n−1)/n·N). tspw_decode_step_traffic and
//   decode_step_traffic count as the runtime's TrafficCounters (counters.hpp), per rank, so a
//   measured decode step compares with ==.
// Cost: O(number of collectives + B) per call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tspemu/plan/cost_model.hpp"
#include "tspemu/runtime/counters.hpp"

namespace tspemu::tsp::cost {

enum class DecodeScheme { tp, sp, tp_sp, helix, tsp_m, tsp_w, megatron_sp };
// "TP", "SP", "TP+SP", "Helix", "TSP-M", "TSP-W", "Megatron-SP"
const char* decode_scheme_name(DecodeScheme s);

struct DecodeStrategy {
  DecodeScheme scheme = DecodeScheme::tsp_w;
  int T = 1;   // TP degree (tp, tp_sp); Helix's TP_A
  int Sp = 1;  // SP degree Σ (sp, tp_sp); Helix's KVP
  int D = 1;   // TSP degree (tsp_m, tsp_w)

  static DecodeStrategy tp(int T) { return {DecodeScheme::tp, T, 1, 1}; }
  static DecodeStrategy megatron_sp(int T) { return {DecodeScheme::megatron_sp, T, 1, 1}; }
  static DecodeStrategy sp(int Sp) { return {DecodeScheme::sp, 1, Sp, 1}; }
  static DecodeStrategy tp_sp(int T, int Sp) { return {DecodeScheme::tp_sp, T, Sp, 1}; }
  static DecodeStrategy helix(int kvp, int tpa) { return {DecodeScheme::helix, tpa, kvp, 1}; }
  static DecodeStrategy tsp_m(int D) { return {DecodeScheme::tsp_m, 1, 1, D}; }
  static DecodeStrategy tsp_w(int D) { return {DecodeScheme::tsp_w, 1, 1, D}; }
  bool tsp() const { return scheme == DecodeScheme::tsp_m || scheme == DecodeScheme::tsp_w; }
  int ranks() const { return tsp() ? D : T * Sp; }
  int token_shards() const;  // TP, Megatron-SP 1; SP, TP+SP Σ; Helix KVP; TSP D
  int head_shards() const;   // the degree splitting the KV heads: TP, Megatron-SP, TP+SP T; Helix
                             // TP_A; else 1
  std::string name() const;  // e.g. "TP T=8", "TP+SP T=2×Σ=4", "Helix KVP=4×TP_A=2", "TSP-W D=8"
};

// Every schedule on n ranks, in table order: TP n, SP n, each TP+SP T×Σ = n (1 < T, Σ), each
// Helix KVP×TP_A = n (KVP > 1), TSP-M n, TSP-W n. (Megatron-SP is not listed: its decode moves
// TP's bytes, ceil(B/T)·T rows where TP has B, and its weights and cache are TP's.)
std::vector<DecodeStrategy> decode_strategies_at(int n);

// Throws std::invalid_argument when the model's shape does not suit the schedule (see above).
void check_decode_shape(const ModelShape& m, const DecodeStrategy& st);

// One collective of the decode step, as the schedule calls it.
struct DecodeCollective {
  std::string what;  // e.g. "Q all-gather", "W_O all-reduce", "LSE all-gather"
  CollectiveKind kind = CollectiveKind::all_reduce;
  int group = 1;            // ranks taking part
  std::uint64_t calls = 0;  // per layer (per_layer) or per step
  // Payload per call, bytes: all_reduce its input; all_gather its whole output; all_to_all one
  // rank's input; broadcast the message; TSP-W's route one rank's K/V slices of the B tokens;
  // TSP-M's ring hop one MLP shard.
  std::uint64_t payload = 0;
  std::uint64_t element_bytes = 0;  // β, or 4 for the LSE
  double per_device = 0;            // ring convention, bytes per device per call
  bool lse = false;                 // the fp32 log-sum-exp term
  bool packed = false;    // travels in the call of the entry before it (no call of its own)
  bool per_layer = true;  // false: once per step (embedding, LM head)
  enum class Group { tp, sp, all } axis = Group::all;  // the T group, the Σ group, every rank
};

struct DecodeCost {
  DecodeStrategy st;
  // Parameters per rank (elements): one layer; embedding + LM head (unless tied) + final norm.
  std::uint64_t layer_params = 0, vocab_params = 0;
  std::uint64_t weight_bytes = 0;  // (L·layer + vocab)·β
  std::uint64_t buffer_bytes = 0;  // TSP-M: one attention and one MLP shard in flight, all layers
                                   // share them (bytes, not per layer)
  std::int64_t kv_heads_held = 0;  // KV heads of the cache per rank
  double kv_duplication = 1;       // copies of each K/V element over the ranks
  std::uint64_t kv_tokens = 0;     // Σ_b ceil(S_b / token shards), the most loaded rank
  std::uint64_t kv_bytes_per_layer = 0, kv_bytes = 0;  // per rank; kv_bytes = L × per layer
  std::uint64_t hbm_read_bytes = 0;                    // per rank per step
  std::vector<DecodeCollective> comm;
  // Ring convention bytes per device: the layers' (L × per layer) without the LSE; the LSE apart;
  // the vocabulary parts (per step).
  double comm_per_layer(bool with_lse = false) const;
  double comm_per_step() const;  // L × comm_per_layer(false)
  double lse_per_step() const;   // L × the LSE collectives
  double vocab_per_step() const;
  std::uint64_t layer_collectives() const;  // calls per layer
  std::uint64_t layers = 0;
};

// The cost of one decode step of `lengths.size()` sequences (B >= 1, each S_b >= 1), elements of
// `beta` bytes (weights, activations, KV), the LSE in fp32.
DecodeCost decode_cost(const ModelShape& m, const DecodeStrategy& st,
                       const std::vector<std::int64_t>& lengths, std::uint64_t beta);

// Bytes of K and V of one token of one layer on one rank holding it: 2·d·KV heads held·β.
std::uint64_t kv_bytes_per_token_layer(const ModelShape& m, const DecodeStrategy& st,
                                       std::uint64_t beta);

// The longest context one sequence (B = 1) can cache when each rank has `budget` bytes: token
// shards · floor((budget − weights − buffers) / (L·kv_bytes_per_token_layer)); 0 if the weights
// alone exceed the budget.
std::int64_t decode_max_context(const ModelShape& m, const DecodeStrategy& st, std::uint64_t budget,
                                std::uint64_t beta);

// Prefill per layer per device, ring convention, elements (the training forward of the matching
// training strategy, cost_model.hpp's paper_forward_elements over m.B, m.S): TP → TP, SP → SP
// (pass-KV), TP+SP → TP+SP, Helix → TP+SP with T = TP_A, Σ = KVP (its cache's layout), TSP-M and
// TSP-W → TSP.
double prefill_elements(const ModelShape& m, const DecodeStrategy& st);

// ---- Runtime counting (TrafficCounters) ------------------------------------------------------

// How TSP-W moves the new tokens' K/V head slices to their owners.
enum class KvRoute {
  send_recv,   // one send per other owner of >= 1 new token (its tokens' slices, packed), one
               // recv per other rank on each rank owning >= 1 new token
  all_gather,  // every rank gathers every head slice of the B tokens (keeps its own tokens')
};
struct TspwDecodeOptions {
  KvRoute route = KvRoute::send_recv;
  bool lse_packed = true;  // out and LSE in one all_to_all (else a second all_to_all of the LSE)
  bool vocab = true;       // the embedding all-reduce and the LM head all-gather
};

// One TSP-W decode step as `rank` (0 <= rank < D) counts it: B = owners.size() new tokens,
// owners[b] the rank caching token b's K/V. Per layer: all_gather Q (block B·h/D·β); the route;
// all_to_all of the partials (block B·(h/D)·β + B·(n_h/D)·4); two all_reduce of B·h elements.
// Per step: all_reduce of the embedding's [B, h], all_gather of the logits (block B·(V/D)·β).
// Requirements: check_decode_shape(tsp_w(D)); D | V when opt.vocab; owners in [0, D).
// The same step split into the decoder's stages (BasicTspwDecoder::last_traffic()'s TspwTraffic),
// all layers summed: embedding and lm_head once per step, the others L times. total() equals
// tspw_decode_step_traffic. Requirements as tspw_decode_step_traffic.
struct TspwStageTraffic {
  TrafficCounters embedding, kv_route, q_gather, partials, o_proj, mlp, lm_head;
  TrafficCounters total() const {
    return embedding + kv_route + q_gather + partials + o_proj + mlp + lm_head;
  }
};
TspwStageTraffic tspw_decode_stage_traffic(const ModelShape& m, int D,
                                           const std::vector<int>& owners, std::uint64_t beta,
                                           int rank, const TspwDecodeOptions& opt = {});

TrafficCounters tspw_decode_layer_traffic(const ModelShape& m, int D,
                                          const std::vector<int>& owners, std::uint64_t beta,
                                          int rank, const TspwDecodeOptions& opt = {});
TrafficCounters tspw_decode_step_traffic(const ModelShape& m, int D, const std::vector<int>& owners,
                                         std::uint64_t beta, int rank,
                                         const TspwDecodeOptions& opt = {});

// The mesh schedules (TP, SP, TP+SP, Helix) as `rank` counts them, all layers and the vocabulary
// parts, from decode_cost's collectives: ranks as baseline_shape.hpp (rank = row·T + col, the T
// group a row, the Σ group a column; Helix: T = TP_A, Σ = KVP). all_reduce by the runtime's
// balanced chunks (all_reduce_bytes); all_gather and all_to_all (n − 1) blocks each way.
// TSP-M and TSP-W are refused (std::invalid_argument): their counts depend on the token owners
// (tspw_decode_step_traffic, tspm_decode_stage_traffic).
TrafficCounters decode_step_traffic(const ModelShape& m, const DecodeStrategy& st, std::int64_t B,
                                    std::uint64_t beta, int rank);

// ---- Per-stage counts of the mesh schedules (the TP and Helix decoders' last_traffic()) --------

// decode_step_traffic split by collective, all layers summed: one stage per entry of
// decode_cost's comm that makes calls of its own, named by its `what` ("W_O all-reduce", "MLP
// down all-reduce", "embedding all-reduce", "LM head logits all-gather", Helix's "partials
// all-to-all", ...), in decode_cost's order; a packed entry (Helix's LSE) adds its bytes to the
// stage it rides with. The stages' sum is decode_step_traffic. Requirements and errors as
// decode_step_traffic.
struct DecodeStageTraffic {
  std::string what;
  CollectiveKind kind = CollectiveKind::all_reduce;
  TrafficCounters traffic;
};
std::vector<DecodeStageTraffic> decode_stage_traffic(const ModelShape& m, const DecodeStrategy& st,
                                                     std::int64_t B, std::uint64_t beta, int rank);

// ---- Prefill, runtime counting (tsp/megatron_sp_decoder.hpp, tsp/sp_decoder.hpp) ----------------

// The Megatron-SP prefill of prompts of `lengths` on T ranks, by stage, as decode_stage_traffic
// counts megatron_sp(T)'s decode step but over N = Σ_b P_b token rows (padded to ceil(N/T)·T)
// where a decode step has B; the logits all-gather is still [B, V/T]. Requirements as
// decode_stage_traffic, every P_b >= 1.
std::vector<DecodeStageTraffic> megatron_sp_prefill_stage_traffic(
    const ModelShape& m, int T, const std::vector<std::int64_t>& lengths, std::uint64_t beta,
    int rank);

// How an SP decoder (tsp/sp_decoder.hpp) processes the prompts; decode is pass-Q whichever.
//   pass_q   every rank computes every prompt token and attends it to its own keys; merge as a
//            decode step (LSE all-gather, output all-reduce over N = Σ_b P_b rows)
//   ring     pass-KV: each rank computes only its N_p own tokens; per layer its K/V block goes
//            round the ring (Σ−1 hops, blocks of unequal size), partials merged by LSE locally
//   ulysses  each rank computes its own tokens; per layer all-to-all sequence→heads of Q, K, V
//            and heads→sequence of the output, each rank's tokens padded to M = Σ_b ceil(P_b/Σ)
//            slots; needs Σ | n_h and Σ | n_kv
// ring and ulysses end with an all-reduce of the B last rows [B, h] (each last token lives on one
// rank; the others add zeros) so every rank computes the logits.
enum class SpPrefill { pass_q, ring, ulysses };
const char* sp_prefill_name(SpPrefill p);  // "pass-Q", "ring pass-KV", "Ulysses"

// The SP prefill on Σ ranks as `rank` counts it, by stage, all layers summed:
//   pass_q   "LSE all-gather" L calls of (Σ−1)·N·n_h·4 each way (the fp32 LSE, as decode);
//            "attention output all-reduce" L calls of all_reduce_bytes(N·h)
//   ring     "K/V ring" L·(Σ−1) sends of L·2·kv_dim·β·(N − N_{rank+1}) bytes in all and L·(Σ−1)
//            receives of L·2·kv_dim·β·(N − N_rank), N_p = tokens_per_rank[p]
//   ulysses  "sequence-heads all-to-all" 4L calls of (Σ−1)·M·(n_h or n_kv)/Σ·d·β each way (Q,
//            K, V, output)
//   ring, ulysses: "last rows all-reduce" one call of all_reduce_bytes(B·h)
// Σ = 1: no stage. Requirements: check_decode_shape(sp(Σ)); every P_b >= 1; ring:
// tokens_per_rank has Σ entries summing to N (the KV ownership map's prompt counts); ulysses:
// Σ | n_h, Σ | n_kv (std::invalid_argument naming the values otherwise).
std::vector<DecodeStageTraffic> sp_prefill_stage_traffic(
    const ModelShape& m, int Sp, SpPrefill kind, const std::vector<std::int64_t>& lengths,
    const std::vector<std::int64_t>& tokens_per_rank, std::uint64_t beta, int rank);

// ---- TSP-M runtime counting (tsp/tspm_decoder.hpp) ---------------------------------------------

// Not a decode_stage_traffic case: that form has one (st, B) per step and counts every rank alike
// within its group, while a TSP-M rank's Q gather, partials and logits depend on which rank owns
// each new token (n_p, k_r below), its broadcasts on which turn it is the root, and the decoder's
// calls are all_gatherv / send / recv / broadcast, not decode_cost's symmetric collectives. So,
// like TSP-W's, its per-stage counts take the owners; decode_stage_traffic refuses tsp_m.
//
// One TSP-M step as `rank` (0 <= rank < D) counts it, by BasicTspmDecoder::last_traffic()'s stages,
// all layers summed. token_owners: the rank owning each new token (decode: B of them, one per
// sequence; prefill: every prompt token); last_owners [B]: the owner of each sequence's last new
// token (decode: token_owners). With n_p the new tokens rank p owns, N = Σ_p n_p, k_r the last
// tokens rank r owns, S_a = P_attn/D·β, S_m = P_mlp/D·β, S_v = (V/D)·h·β:
//   embedding         D broadcasts of S_v (root s sends (D−1)·S_v, every other rank receives S_v)
//   attention_shards  L·D broadcasts of S_a, counted the same
//   q_gather          L·D all_gatherv: sends (D−1)·n_r·(h/D)·β, receives (N − n_r)·(h/D)·β
//   partials          L·D exchanges: a send of n_p·((h/D)·β + (n_h/D)·4) to each p ≠ r with
//                     n_p > 0; when n_r > 0, D−1 receives of n_r·(h/D·β + n_h/D·4)
//   mlp_shards        L·(D−1) ring hops: a send and a receive of S_m each
//   lm_head           D broadcasts of S_v (tied: the embedding's shards again, as training)
//   logits            one all_gatherv of the owners' [V] rows: sends (D−1)·k_r·V·β, receives
//                     (B − k_r)·V·β
// The LSE in fp32 (4 B) as decode_cost's; the decoder sends it as its scalar type, so its float
// run (β = 4) compares with ==. Summed over the ranks, the sent bytes are D × decode_cost's
// per-device ring bytes for tsp_m (decode, B tokens, layers + LSE + vocabulary).
// Requirements: check_decode_shape(tsp_m(D)); D | V; owners in [0, D); last_owners non-empty.
// (std::invalid_argument naming the value otherwise.)
struct TspmStageTraffic {
  TrafficCounters embedding, attention_shards, q_gather, partials, mlp_shards, lm_head, logits;
  TrafficCounters total() const {
    return embedding + attention_shards + q_gather + partials + mlp_shards + lm_head + logits;
  }
};
TspmStageTraffic tspm_step_stage_traffic(const ModelShape& m, int D,
                                         const std::vector<int>& token_owners,
                                         const std::vector<int>& last_owners, std::uint64_t beta,
                                         int rank);
// A decode step: one new token per sequence, owners[b] its rank.
TspmStageTraffic tspm_decode_stage_traffic(const ModelShape& m, int D,
                                           const std::vector<int>& owners, std::uint64_t beta,
                                           int rank);

}  // namespace tspemu::tsp::cost
