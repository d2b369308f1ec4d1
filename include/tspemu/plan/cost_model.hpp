// Analytic cost model of TSP and its baselines: closed forms of the bytes moved per collective
// kind, per layer and per rank, forward and backward; and a whole-model per-device memory
// estimate for real model sizes (`tspemu plan`). A plain library in the leaf module plan/: no
// threads, no World, no Arena, no blocks. Its traffic is the runtime's TrafficCounters
// (counters.hpp), so a prediction compares with a measurement by ==; its time model reads the
// simulated clock's link presets (sim_clock.hpp).
//
// Inputs
//   ModelShape    B, S, hidden h, n_heads, n_kv_heads, ffn (the gated-MLP width F·h, absolute, as
//                 ref::ModelConfig::ffn), layers L, vocab V.
//   Strategy      TSP degree D; TP degree T; TP + Megatron-SP degree T; SP (context parallel)
//                 degree Sp; TP+SP mesh T × Sp; DeepSpeed-Ulysses and ring attention degree n
//                 (Strategy::tsp/tp/megatron_sp/sp/tp_sp/ulysses/ring; n is stored as Sp).
//   ElementSizes  bytes per activation / weight / gradient element, optimizer bytes per parameter
//                 (default bf16: 2 / 2 / 2 / 12 = fp32 Adam m, v and master copy, TSP-NOTES.md),
//                 bytes per index (int64 positions). ElementSizes::fp32_emulator() is what the
//                 emulator allocates (float everywhere, no optimizer).
//   CostOptions   mirrors tspemu::tsp::TspOptions: head_buckets, keep_attention_shards, keep_kv.
//
// Conventions
//   Runtime counting (layer_traffic(...).forward/.backward): bytes a rank receives and sends, per
//   collective kind, exactly as include/tspemu/runtime/counters.hpp counts them:
//     broadcast       root sends (n-1)·N, each other rank receives N
//     all_gather      each rank receives (n-1) blocks, sends its block n-1 times
//     reduce_scatter  each rank receives and sends (n-1) blocks
//     all_reduce      2-step over balanced chunks (the first N mod n chunks one element longer):
//                     rank r receives (N - c_r) + (n-1)·c_r, c_r its chunk; 2(n-1)/n·N when n | N
//     reduce          root receives (n-1)·N, every other rank sends N
//     send / recv     the message
//   Paper convention (LayerTraffic::paper_*): the ring cost model of TSP-NOTES.md, per rank,
//   elements × bytes, as a real number: all_gather / reduce_scatter / reduce / broadcast of N over
//   n ranks (n-1)/n·N, all_reduce 2(n-1)/n·N, a ring hop N. Where they differ:
//     * all_reduce with n ∤ N: runtime bytes depend on the rank (chunk sizes), paper does not;
//     * broadcast and reduce per call: the runtime charges the root (n-1)·N; the ring spreads it.
//       TSP rotates the root over all D ranks, so per layer the received bytes agree exactly
//       ((D-1)·shard = (D-1)/D·params), only the root's sent bytes differ per call;
//     * TSP's norm-weight gradient all-reduces (2 × h per layer, backward) are in both, but the
//       TSP-NOTES table lists forward only.
//   Paper forward volume per layer per rank (TSP-NOTES.md table; g = n_h/n_kv, F = ffn/h):
//     TP           4(T-1)/T · B·S·h
//     SP           2(Sp-1)/Sp · B·S·h/g
//     TP+SP        4(T-1)/T · B·(S/Sp)·h + 2(Sp-1)/Sp · B·S·h/(g·T)
//     Megatron-SP  the same bytes as TP, as all_gather + reduce_scatter
//     TSP          (D-1)/D · (2 + 2/g + 3F)·h² + 2(D-1)/D · B·S·h/g
//     Ulysses      4 all-to-alls of B·(S/n)-token tensors, (n-1)/n of each crossing:
//                  (n-1)/n · B·(S/n)·(2h + 2h/g)       (Q and the output h wide, K and V h/g)
//     Ring         n-1 hops of the K/V block: 2(n-1)/n · B·S·h/g (the SP volume, by sendrecv)
//   so with g = 1, F = 4, D = T: TSP/TP = 1/2 + 4h/(B·S), below 1 exactly when B·S > 8h.
//   Backward (derived, the adjoint; see tsp/tsp_attention.hpp, tsp_mlp.hpp, baseline_*.hpp):
//     TSP          re-broadcast (unless keep_attention_shards) + K/V re-gather (unless keep_kv)
//                  + dK/dV reduce_scatter + attention dW reduce to owner + MLP ring: D-1 weight
//                  hops and D gradient hops + 2 norm-gradient all-reduces of h
//     TP           2 all-reduces of dN (B·S·h); norm gradients need none (replicated tokens)
//     Megatron-SP  per block all_gather(dY) + reduce_scatter(dN), + 2 norm-gradient all-reduces
//                  over all ranks (the implementation calls the all_gather even when T = 1)
//     SP / TP+SP   K/V re-gather + dK/dV reduce_scatter over sp; weight gradients all-reduced
//                  over sp (the shard, 1/T of the layer); norm gradients all-reduced over sp;
//                  TP+SP adds the 2 tp all-reduces of dN.
//     Ulysses      7 all-to-alls (Q, K, V exchanged again for the recomputed projections, dA,
//                  dQ, dK, dV); the exchanges run even when n = 1 (0 bytes).
//     Ring         n-1 K/V hops and n dK/dV hops (the accumulators travel with the blocks and
//                  return to their owner), n > 1 only.
//     Both         one all_reduce of the attention weights' and norm's gradients together
//                  (all_reduce_buffers: one call, the bytes of their concatenation), and the SP
//                  MLP block's two (norm, weights), n > 1 only.
//   Mesh ranks (baselines) as baseline_shape.hpp: rank = row·T + col, the tp group is the row
//   (rank col in it), the sp group the column (rank row).
//   The runtime counts of the TSP layer, the baseline layer (BaselineAttention then BaselineMlp)
//   and the Ulysses / ring layer (SequenceShardedAttention with its core, then the SP BaselineMlp)
//   are checked against the measurement in tests/tsp/cost_model_test.cpp.
//   All results are bytes.
//
// Memory of one layer as the blocks allocate it is not modelled here: it is measured by running
// the blocks dry at any size (tsp/layer_measure.hpp: accounting-only arenas, no arithmetic), so a
// change of an allocation in a block needs no change here.
//
// Whole-model per-device memory (device_memory, for `tspemu plan` and `tspemu paper`): the sum of
// parts a training engineer budgets, each under a stated assumption (MemoryAssumptions):
//   model states   parameters per device × bytes per parameter (PrecisionModel: weights,
//                  gradients, master copy, optimizer moments); no ZeRO (one node, no data
//                  parallelism). Sharding of the layers as the strategy's blocks; embedding and
//                  LM head: TP, Megatron-SP and TP+SP split the vocabulary over T (Megatron's
//                  vocab-parallel embedding), SP replicates, TSP splits it over D when
//                  tsp_shards_vocab (as the emulator's TspModel) and replicates it otherwise.
//   activations    what backward keeps (Korthikanti et al. 2022, "Reducing Activation
//                  Recomputation in Large Transformer Models", adapted to RMSNorm, GQA, no dropout
//                  and the gated MLP; per token per layer, activation bytes unless fp32):
//                    layer input h, attention-norm output h, rstd (fp32), Q h, K h/g, V h/g,
//                    attention output h (W_O's input), softmax log-sum-exp n_h (fp32),
//                    MLP input h, MLP-norm output h, rstd (fp32), gate F, up F, silu(gate)·up F
//                    (W_down's input), and with materialized attention the softmax n_h·S;
//                  sharding per Korthikanti: without sequence parallelism the norm region (layer
//                  input, norm outputs, MLP input, rstd) is replicated over the TP group and the
//                  rest is split over T; Megatron-SP splits everything over T; TSP and SP hold
//                  their B·S/D (B·S/Sp) tokens at full width.
//                  Recompute::none keeps that set for every layer; selective (Korthikanti §5)
//                  drops the attention core's softmax (only present with materialized attention:
//                  flash-style attention keeps none, so selective = none); full keeps the layer
//                  input per layer (as the strategy shards it) plus one layer's whole set while
//                  that layer is recomputed.
//   logits         the loss's [tokens, V] logits and their gradient, logit_bytes each element,
//                  per device B·S·V/N for every strategy (tokens or vocabulary split N ways), or a
//                  chunk of logit_chunk_tokens tokens; TSP with tsp_shards_vocab computes one
//                  vocabulary shard at a time (online log-sum-exp, tsp_model.hpp): V/D wide.
//                  Counted as live at the layers' peak: an upper bound.
//   comm           one layer's communication buffers in flight at its peak: TSP's broadcast
//                  weight shard and its gradient, the MLP ring's shards, the full-sequence K/V of
//                  a bucket and its gradient; SP's gathered K/V and their gradients; TP's
//                  collective buffer of one [tokens, h] activation.
//   workspace      that layer's other temporaries (projections, MLP intermediates, gradients).
//   overhead       a framework constant (GPU context, collective library buffers, allocator
//                  reserve): 0 unless given, shown apart.
// Ulysses and ring attention are not in this estimate (std::invalid_argument): their per-rank
// memory comes from a dry run (tsp/layer_measure.hpp). Estimates, not measurements; `tspemu paper`
// sets them beside the published numbers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tspemu/reference/model_config.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/sim_clock.hpp"

namespace tspemu::tsp::cost {

struct ModelShape {
  std::int64_t B = 1;
  std::int64_t S = 0;
  std::int64_t hidden = 0;  // h
  std::int64_t n_heads = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t ffn = 0;  // MLP width (absolute; the F of TSP-NOTES is ffn / hidden)
  std::int64_t layers = 1;
  std::int64_t vocab = 0;
  bool tie_embeddings = false;

  static ModelShape from(const ref::ModelConfig& m, std::int64_t B, std::int64_t S);
  std::int64_t head_size() const { return hidden / n_heads; }
  std::int64_t kv_dim() const { return n_kv_heads * head_size(); }
  std::int64_t q_dim() const { return n_heads * head_size(); }
  double g() const { return static_cast<double>(n_heads) / static_cast<double>(n_kv_heads); }
  // Parameters of one layer: attention (W_Q, W_K, W_V, W_O), MLP (gate, up, down), 2 norms.
  std::int64_t attention_params() const { return hidden * (2 * q_dim() + 2 * kv_dim()); }
  std::int64_t mlp_params() const { return 3 * ffn * hidden; }
  std::int64_t layer_params() const { return attention_params() + mlp_params() + 2 * hidden; }
  // Embedding + LM head (unless tied) + final norm.
  std::int64_t vocab_params() const { return (tie_embeddings ? 1 : 2) * vocab * hidden + hidden; }
  std::int64_t total_params() const { return layers * layer_params() + vocab_params(); }
  // Forward FLOPs of one layer over all B·S tokens, as GEMMs: the weights' 2·B·S·(attention + MLP
  // params), and the causal attention core's QKᵀ and PV over half the (query, key) pairs,
  // 2 · 2·B·S·S·h / 2. Backward is twice the forward (dX and dW, or dQ/dK/dV's two products each).
  double weight_gemm_flops() const {
    return 2.0 * static_cast<double>(B) * static_cast<double>(S) *
           static_cast<double>(attention_params() + mlp_params());
  }
  double attention_core_flops() const {
    return 2.0 * static_cast<double>(B) * static_cast<double>(S) * static_cast<double>(S) *
           static_cast<double>(hidden);
  }
};

// The strategies; everything about each (names, mesh, rules, formulas, blocks) is its entry in the
// strategy table (strategy_table.hpp; the blocks: tsp/strategy.hpp), indexed by this enum in this
// order.
enum class Scheme { tsp, tp, megatron_sp, sp, ulysses, ring, tp_sp };
// The table's title: "TSP", "TP", "TP+Megatron-SP", "SP", "Ulysses", "Ring attention", "TP+SP"
const char* scheme_name(Scheme s);

struct Strategy {
  Scheme scheme = Scheme::tsp;
  int D = 1;   // TSP degree (tsp only)
  int T = 1;   // tensor-parallel degree (tp, megatron_sp, tp_sp)
  int Sp = 1;  // sequence-parallel degree (sp, tp_sp; the degree n of ulysses, ring)

  static Strategy tsp(int D) { return {Scheme::tsp, D, 1, 1}; }
  static Strategy tp(int T) { return {Scheme::tp, 1, T, 1}; }
  static Strategy megatron_sp(int T) { return {Scheme::megatron_sp, 1, T, 1}; }
  static Strategy sp(int Sp) { return {Scheme::sp, 1, 1, Sp}; }
  static Strategy tp_sp(int T, int Sp) { return {Scheme::tp_sp, 1, T, Sp}; }
  static Strategy ulysses(int n) { return {Scheme::ulysses, 1, 1, n}; }
  static Strategy ring(int n) { return {Scheme::ring, 1, 1, n}; }
  // Ulysses or ring attention: tokens sequence-sharded, weights replicated, the SP MLP block.
  bool attention_core() const { return scheme == Scheme::ulysses || scheme == Scheme::ring; }
  int ranks() const { return scheme == Scheme::tsp ? D : T * Sp; }
  std::string name() const;  // e.g. "TSP D=8", "TP+SP T=2×Σ=4", "Ulysses n=4"
};

struct ElementSizes {
  double activation = 2;  // bytes per activation element
  double weight = 2;
  double gradient = 2;
  double optimizer_per_param = 12;  // fp32 Adam m, v + fp32 master weights
  double index = 8;                 // int64 positions (Category::other)
  static ElementSizes bf16() { return {}; }
  // The emulator: float activations, weights and gradients, no optimizer state.
  static ElementSizes fp32_emulator() { return {4, 4, 4, 0, 8}; }
};

struct CostOptions {  // mirrors TspOptions (tsp/tsp_shape.hpp: tsp::cost_options converts)
  int head_buckets = 1;
  bool keep_attention_shards = false;
  bool keep_kv = false;
  // The overlapped attention schedule: two shard and two gradient buffers, and with head buckets
  // (K/V re-gathered in backward) the dK/dV send buffer, 2·B·S·NKVb·hs.
  bool overlap = true;
};

// ---- Traffic --------------------------------------------------------------------------------

// What backward keeps of the forward's activations: full recompute keeps each layer's input and
// re-runs the layer's forward in backward (Korthikanti et al. 2022 §4); none keeps every
// activation; selective recomputes only the attention core (§5). Declared here because the
// backward traffic depends on it.
enum class Recompute { none, selective, full };

struct LayerTraffic {
  TrafficCounters forward, backward;  // runtime counting, this rank
  double paper_forward = 0;           // ring cost model, bytes per rank (TSP-NOTES table)
  double paper_backward = 0;          // ring cost model, derived adjoint
  // Ring cost model, bytes per rank: the forward collectives that recomputing the layer in
  // backward re-runs and paper_backward does not already hold (TP's all-reduces, Megatron-SP's
  // all-gather + reduce-scatter, Ulysses' output exchange, ring's K/V hops; 0 for TSP and SP,
  // whose backward re-gathers K/V and re-broadcasts the shards anyway). The emulator's blocks keep
  // their activations, so the runtime counts (forward, backward) never include it.
  double paper_recompute = 0;
  // Of paper_recompute, what re-running the attention core alone moves (selective recompute):
  // ring attention's K/V hops; 0 for every other strategy (their cores are local once Q, K, V
  // are, and backward brings those anyway).
  double paper_recompute_core = 0;
  // Backward bytes per rank under a recompute policy: paper_backward, plus paper_recompute (full)
  // or paper_recompute_core (selective).
  double paper_backward_under(Recompute rc) const;
};

// Bytes of one layer (attention block then MLP block) for `rank` (0 <= rank < ranks()), in the
// runtime's elements of size `activation` for activations and `weight` for weights/gradients
// (the emulator moves floats: ElementSizes::fp32_emulator()). Requirements as the
// implementations: D (T) | n_heads, n_kv_heads, ffn; D | S, Sp | S; head_buckets | n_kv_heads/D;
// Ulysses: n | n_heads, n_kv_heads (std::invalid_argument otherwise; the zigzag layout's 2D | S is
// not required here).
LayerTraffic layer_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                           const CostOptions& opt = {}, int rank = 0);

// The TSP-NOTES forward-volume formula, elements (not bytes), per layer per rank.
double paper_forward_elements(const ModelShape& m, const Strategy& st);

// The ring cost model's share of one rank in a collective of N elements over n ranks:
// (n-1)/n·N (0 for n <= 1).
double ring_volume(double N, int n);

// The closed forms of layer_traffic by family of blocks, which the strategy table's entries
// point at; layer_traffic checks the shape and the rank first, these do not.
//   tsp_layer_traffic               TspLayer (tsp)
//   mesh_layer_traffic              BaselineAttention + BaselineMlp (tp, megatron_sp, sp, tp_sp)
//   sequence_sharded_layer_traffic  SequenceShardedAttention with its core + the SP BaselineMlp
//                                   (ulysses, ring)
LayerTraffic tsp_layer_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                               const CostOptions& opt, int rank);
LayerTraffic mesh_layer_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                                const CostOptions& opt, int rank);
LayerTraffic sequence_sharded_layer_traffic(const ModelShape& m, const Strategy& st,
                                            const ElementSizes& es, const CostOptions& opt,
                                            int rank);

// The whole model's parts outside the layers — embedding, final norm, LM head, loss — on one rank,
// counted like the runtime (the strategy's RankModel, tsp/strategy.hpp). With Vl = V / vocab_shards
// rows per shard, R = B·S/Sp row tokens (TSP: the shard of V/D × h weights):
//   TSP (tsp_model.hpp)   forward: D broadcasts of the embedding shard and D of the LM head shard
//                         (root rotating), the loss all_reduce of one double; backward: D head
//                         broadcasts again, D reduces of the head's and D of the embedding's
//                         gradient shard to their owners, the final norm's gradient all_reduce.
//   mesh (mesh_model.hpp) over the TP group (T > 1): forward the embedding's all_reduce of
//                         [R, h] (Megatron-SP: its reduce_scatter to the pieces and the LM head
//                         input's all_gather), the cross-entropy's all_gather of the per-token
//                         maxima (R each) and all_reduces of the sum-exp and the target logit
//                         (R each); backward the LM head input gradient's all_reduce of [R, h]
//                         (Megatron-SP: the input's all_gather again, the reduce_scatter, and the
//                         embedding gradient's all_gather). Over the SP group (Sp > 1): the loss
//                         all_reduce (one double), the embedding's (tied: with the head's) and
//                         the untied LM head's gradient all_reduce of [Vl, h]. The final norm's
//                         gradient all_reduce of h: over every rank under Megatron-SP, else over
//                         the SP group.
// Elements: activations es.activation (logits and their statistics too), weights es.weight,
// gradients es.gradient, the loss 8 bytes (a double).
struct VocabTraffic {
  TrafficCounters forward, backward;
};
// Requirements as layer_traffic, and vocab_shards(st) | m.vocab (std::invalid_argument).
VocabTraffic vocab_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                           int rank = 0);
// The closed forms the strategy table's entries point at (unchecked input).
VocabTraffic tsp_vocab_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                               int rank);
VocabTraffic mesh_vocab_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                                int rank);
// How many shards of rows the strategy's whole model cuts the embedding and LM head into: TSP D;
// TP, Megatron-SP, TP+SP T (vocabulary-parallel over the TP group); SP, Ulysses, ring 1.
int vocab_shards(const Strategy& st);

// Bytes rank r receives (= sends) in an all_reduce of `count` elements over n ranks, as the
// runtime counts it (balanced chunks).
std::uint64_t all_reduce_bytes(std::uint64_t count, int n, int r, double element_bytes);

// ---- Whole model, per device, real sizes (plan) -----------------------------------------------

// Bytes per parameter of the model states.
struct PrecisionModel {
  double weight = 2;      // the weights the GEMMs read (bf16)
  double gradient = 2;    // the gradient buffer (bf16)
  double master = 4;      // fp32 master copy of the weights (0: none, updated in place)
  double moments = 8;     // Adam's m and v (fp32 each)
  double activation = 2;  // bytes per activation element (bf16)
  double per_param() const { return weight + gradient + master + moments; }
  // bf16 mixed precision with fp32 Adam (ZeRO, Rajbhandari et al. 2020 §3.1: 2 + 2 + 12 = 16
  // B/param, the "2 bytes weights + 2 bytes grads + 12 bytes fp32 Adam state" of TSP-NOTES.md).
  static PrecisionModel mixed_bf16() { return {}; }
  // Megatron-LM's bf16 training: fp32 main gradients (--accumulate-allreduce-grads-in-fp32, the
  // default with bf16), so 2 + 4 + 4 + 8 = 18 B/param.
  static PrecisionModel megatron_bf16() { return {2, 4, 4, 8, 2}; }
  // tspemu's own emulated run: fp32 weights, gradients and activations; AdamW's fp32 m and v
  // updating the fp32 weights in place (no master copy): 4 + 4 + 0 + 8 = 16 B/param.
  static PrecisionModel fp32_emulator() { return {4, 4, 0, 8, 4}; }
};

// One rank's parameter state, bytes (params: elements).
struct ParameterState {
  double params = 0;
  double weights = 0, gradients = 0, master = 0, moments = 0;
  double optimizer() const { return master + moments; }
  double total() const { return weights + gradients + master + moments; }
};

// The parameters one rank of `st` holds, times p's bytes per parameter: every layer's shard of
// the strategy's blocks (TSP: 1/D of the attention and MLP weights; TP, Megatron-SP, TP+SP: 1/T;
// SP, Ulysses, ring: all) plus both norm weights (replicated); with m.vocab > 0 also the
// embedding, the LM head (unless tied) and the final norm, the vocabulary split as stated above
// (TSP: over D when tsp_shards_vocab); m.vocab == 0 is the emulator's layer stack, which has none
// of them. Requirements: the strategy's divisibility rules (std::invalid_argument otherwise);
// every rank holds the same count. Exact for integer byte sizes (counts below 2^53).
ParameterState parameter_state_bytes_per_rank(const Strategy& st, const ModelShape& m,
                                              const PrecisionModel& p,
                                              bool tsp_shards_vocab = true);

// How the memory estimate treats what the model does not fix (see the comment at the top).
struct MemoryAssumptions {
  PrecisionModel precision = PrecisionModel::mixed_bf16();
  Recompute recompute = Recompute::full;
  bool materialized_attention = false;   // keep the [S, S] softmax per head (no flash attention)
  double logit_bytes = 4;                // fp32 logits for the loss
  bool logit_gradient_in_place = false;  // the gradient overwrites the logits (one buffer)
  std::int64_t logit_chunk_tokens = 0;   // 0: every token's logits at once
  bool tsp_shards_vocab = true;
  double framework_overhead = 0;  // bytes per device
  CostOptions tsp;                // TSP's buckets and kept shards / K/V
};

struct DeviceMemory {
  double params = 0;  // parameters held by the device
  double weights = 0, gradients = 0, master = 0, moments = 0;
  double activations = 0;  // kept for backward
  double logits = 0;       // logits and their gradient
  double comm = 0;         // one layer's communication buffers at its peak
  double workspace = 0;    // that layer's other temporaries
  double overhead = 0;     // framework constant
  double optimizer() const { return master + moments; }
  double model_states() const { return weights + gradients + master + moments; }
  double total() const {
    return model_states() + activations + logits + comm + workspace + overhead;
  }
};

// Per-layer parts, per device: elements (params) or bytes.
struct LayerMemoryEstimate {
  double params = 0;      // parameters of one layer held by the device
  double kept = 0;        // what backward keeps without recompute (Recompute::none)
  double selective = 0;   // what it keeps under selective recompute
  double checkpoint = 0;  // the layer input (what Recompute::full keeps)
  double comm = 0;        // communication buffers in flight at the layer's peak
  double workspace = 0;   // other temporaries at that peak
  double tokens = 0;      // tokens the device processes (B·S/D; TP, Megatron-SP: B·S; B·S/Sp)
};
LayerMemoryEstimate layer_memory(const ModelShape& m, const Strategy& st,
                                 const MemoryAssumptions& a = {});

DeviceMemory device_memory(const ModelShape& m, const Strategy& st,
                           const MemoryAssumptions& a = {});

// ---- Time per training step (plan, paper) ----------------------------------------------------
//
// A roofline-style estimate, not a measurement. Per layer per device:
//   compute    FLOPs / (peak · MFU): GEMMs 2·B·S·(attention + MLP params) forward, the causal
//              attention core 2·B·S²·h forward (QKᵀ and AV, half the pairs), both split evenly over
//              the strategy's N ranks; backward 2 × forward; full recompute + 1 forward, selective
//              + the attention core's forward. The LM head adds 3 · 2·B·S·V·h / N once.
//   comm       the ring convention's bytes (LayerTraffic::paper_*, activation-sized elements,
//              backward under the recompute policy) / β, plus latency α per step — the
//              simulated clock's ring formulas (sim_clock.hpp) with its SimClockModel parameters;
//              each call's latency steps are SimClockModel::latency_steps (all_reduce 2(n-1), a
//              ring hop 1) on the strategy's widest axis.
//              A group that fits in one node uses the node's link, else the network's: TP+SP puts
//              its T axis in a node and Σ across nodes when T·Σ exceeds a node.
//   overlap    TSP: the weight broadcasts, K/V all-gathers and MLP ring hops are prefetched by its
//              multi-stream pipeline (paper) and overlap compute: exposed max(0, comm - compute).
//              SP: the K/V exchange and the weight-gradient all-reduces overlap (ring attention;
//              bucketed gradient reduction). TP, Megatron-SP: their collectives sit between
//              dependent GEMMs, fully exposed; TP+SP: the TP part exposed, the SP part overlapped.
//   data       total_devices / N replicas; the gradient all-reduce over replicas (network link,
//              gradient bytes per parameter) overlaps the backward: exposed max(0, t - backward).
// tokens/s = replicas · B·S / step time.
struct DeviceModel {
  std::string name;
  double peak_flops = 0;     // dense bf16 FLOP/s
  double mfu = 0.4;          // the fraction of peak the GEMMs and attention reach
  int devices_per_node = 8;  // devices joined by `node`
  SimClockModel node;        // link inside a node (α, β)
  SimClockModel network;     // link between nodes, per device
  // The planner's view of a simulated-clock preset (sim_clock.hpp, where the device and link
  // numbers are cited): node = its intra-node link, network = its inter-node link.
  static DeviceModel from_clock(const std::string& name, const SimClockModel& clock);
  // SimClockModel::mi300x_if(): 1307.4 TFLOP/s, Infinity Fabric 448 GB/s, 400 Gb/s NIC, MFU 0.4.
  static DeviceModel mi300x();
  // SimClockModel::h100_nvlink(): 989 TFLOP/s, NVLink 450 GB/s, 400 Gb/s NIC, MFU 0.4.
  static DeviceModel h100();
};

struct StepTime {
  double compute = 0;        // seconds per step, all layers and the LM head
  double comm = 0;           // all the layers' communication, seconds
  double exposed_comm = 0;   // what is not hidden behind compute
  double data_parallel = 0;  // exposed gradient all-reduce over replicas
  double step = 0;           // compute + exposed_comm + data_parallel
  int replicas = 1;
  double tokens_per_s = 0;  // all replicas
};

// Requirements: total_devices a positive multiple of st.ranks(); dev.peak_flops, mfu in (0, 1],
// link β > 0 (std::invalid_argument otherwise); the strategy's rules as layer_traffic.
StepTime step_time(const ModelShape& m, const Strategy& st, const DeviceModel& dev,
                   const MemoryAssumptions& a, int total_devices);

// The paper's 7B-class model (TSP-NOTES.md): h 4096, L 32, 32 heads, F = 4h gated, V 32000.
ModelShape paper_7b(std::int64_t B, std::int64_t S);

}  // namespace tspemu::tsp::cost
