// The strategy table: everything tspemu knows about each parallel strategy, in one entry each —
// its name as the CLI spells it, a one-line description, its mesh (how the ranks split into
// TP × SP), its divisibility rules, its block and model factories (the per-rank layer and whole
// model `run` builds) and its traffic formulas (the cost model's closed forms). The blocks'
// validation (TspShape, BaselineShape, the Ulysses core), the cost model and the `tspemu` commands
// all ask this table, so a rule or a name is stated once.
//
// Strategies (TSP-NOTES.md): tsp (D ranks on one folded axis), tp (Megatron, T = D), megatron-sp
// (TP with Megatron sequence parallelism, T = D), sp (context parallel, Sp = D), ulysses and ring
// (sequence-sharded attention cores, degree n = D, stored as Sp), tp-sp (a T × Sp mesh, every
// factorization). Table order is the order `compare` and `plan` list them in.
//
// Requirements: a cost::Strategy's scheme is one of the table's (every cost::Scheme has exactly
// one entry, checked at compile time: the table is indexed by the enum).
// Guarantees: strategy_named() throws std::invalid_argument listing every known name for an
// unknown one; violation() returns the first rule a shape breaks, with a message naming the
// values ("T=4 does not divide n_heads=30 (each rank owns whole query heads)"), or nullopt.
// Cost: a lookup is an array index (or a scan of the seven names); the rules are a few integer
// divisions.
//
// Adding a strategy: a cost::Scheme value (cost_model.hpp, in table order) and its entry in
// strategy.cpp. The entry points at functions: the divisibility rules and the paper-convention
// forward volume live in strategy.cpp; the runtime-counted layer traffic is a cost-model function
// per family of blocks (cost_model.hpp; each rejects a strategy outside its family), and the
// block factory builds the blocks from tsp/*.hpp; the model factory wraps them in a whole model
// (a mesh strategy: MeshModel, whose embedding/LM head/loss traffic is cost::mesh_vocab_traffic).
// A strategy built from existing blocks needs nothing else: the commands, the option parser and
// the blocks' validation read the table. A new family of blocks also needs its layer_traffic
// closed form and, while `run` checks weights and gradients against the cost model's arena
// replay (tsp_layer_memory, baseline_layer_memory), a replay of its allocations.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/cost_model.hpp"
#include "tspemu/tsp/parameter_shard.hpp"
#include "tspemu/tsp/sequence_layout.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {

// ---- Divisibility rules ---------------------------------------------------------------------

// What a rule found not divisible.
enum class Quantity { heads, kv_heads, ffn, seq, head_buckets, vocab, degree };

// Which degree of the strategy a rule's divisor comes from: the first axis (TSP's D, TP's T, the
// degree n of Ulysses and ring) or the sequence-parallel axis Sp of a mesh.
enum class Axis { first, sp };

struct Violation {
  Quantity quantity;
  std::int64_t value = 0;     // the quantity's value (head_buckets: the KV heads of a shard)
  std::int64_t divisor = 0;   // what must divide it (head_buckets: the bucket count)
  std::string divisor_label;  // as in an equation: "D", "2·D", "T", "2·Sp", "n", "2·n"
  Axis axis = Axis::first;
  std::string purpose;  // why, for messages: "for the zigzag layout", "" ...
  std::string message;  // the whole sentence: "T=4 does not divide n_heads=30 (...)"
};

struct RuleOptions {
  // true: the rules of the blocks (TSP's layout; the zigzag rows of every sequence-sharded
  // strategy need 2·degree | S). false: the cost model's view, degree | S only.
  bool layout_rules = true;
  LayoutKind tsp_layout = LayoutKind::zigzag;
  int head_buckets = 1;      // TSP's K/V all-gathers per head shard
  bool whole_model = false;  // the vocabulary shards of the embedding and LM head: D (T) | vocab
};

// ---- Block factory --------------------------------------------------------------------------

// The problem a strategy's blocks run: the model (n_layers unused), batch, sequence and TSP's
// options (the baselines use zigzag rows).
struct LayerProblem {
  ref::ModelConfig model;
  int B = 1;
  int S = 0;
  TspOptions tsp;
};

// Where a rank sits: its tokens, and the weight shard it holds.
struct RankPlacement {
  std::vector<std::int64_t> positions;  // global positions of its token rows, in local order
  TspShape shard_shape;                 // the packing of its shards (packed_shards.hpp)
  int shard = 0;                        // which shard of shard_shape.D it holds
  bool reports_tokens = false;          // the one replica that reports these tokens' outputs
  bool reports_shard = false;           // the one replica that reports this shard's gradients
};

// One rank's layer: the attention block then the MLP block, on the rank's token rows
// ([B, rows, C], rows = placement.positions.size()). The attention output is kept between
// forward and backward (activations); backward allocates its gradient (workspace).
class RankLayer {
 public:
  virtual ~RankLayer() = default;
  virtual void forward(const float* x, float* y) = 0;
  // x: forward's input; dx overwritten; the blocks' gradients overwritten.
  virtual void backward(const float* x, const float* dy, float* dx) = 0;
  // Packed like the weights (placement's shard_shape, shard); norms [C], complete on every rank.
  virtual std::span<const float> attention_grad_shard() const = 0;
  virtual std::span<const float> mlp_grad_shard() const = 0;
  virtual std::span<const float> attention_grad_norm() const = 0;
  virtual std::span<const float> mlp_grad_norm() const = 0;
  // The layer's parameters for the optimizer: attention shard, input norm, MLP shard, post norm
  // (packed like the gradients; valid after the first backward, which allocates the gradients).
  virtual std::vector<ParameterShard> parameters() = 0;
};

// One rank's whole model: embedding, L layers (its strategy's RankLayer), final RMSNorm, LM head
// and the mean cross-entropy, forward and backward. How each strategy shards the embedding and
// the LM head is its model's header: tsp_model.hpp (TSP: vocabulary shards broadcast one owner at
// a time), mesh_model.hpp (TP, Megatron-SP, TP+SP: vocabulary-parallel over the TP group; SP,
// Ulysses, ring: replicated).
class RankModel {
 public:
  virtual ~RankModel() = default;
  // tokens, targets: the full [B, S] ids, the same on every rank; each rank reads the tokens it
  // holds. Returns the mean cross-entropy over all B·S tokens, bitwise the same on every rank.
  // An id outside [0, vocab) throws std::invalid_argument naming the rank and the id.
  virtual double forward(std::span<const std::int32_t> tokens,
                         std::span<const std::int32_t> targets) = 0;
  // The loss' gradient of every parameter this rank holds (overwritten); once per forward.
  virtual void backward() = 0;
  // Writes this rank's share of the gradients (weights) into their places in full-size tensors.
  // One replica writes each element, so every rank may fill the same `full` concurrently.
  virtual void write_gradients(ref::ModelWeights<float>& full) const = 0;
  virtual void write_weights(ref::ModelWeights<float>& full) const = 0;
  // Every parameter this rank holds, for the optimizer (valid after the first backward).
  virtual std::vector<ParameterShard> parameters() = 0;
};

// ---- The table ------------------------------------------------------------------------------

// How the ranks form the strategy's mesh.
enum class MeshKind {
  one_axis,  // D ranks, one degree (--ranks)
  grid,      // T × Sp ranks (--tp, --sp); at N ranks every factorization with T, Sp > 1
};

struct StrategyInfo {
  cost::Scheme scheme;
  const char* name;         // as the CLI spells it: "tp-sp"
  const char* title;        // as reports print it: "TP+SP"
  const char* description;  // one line, for --help
  MeshKind mesh;
  const char* degree_name;    // "the TSP degree" (the first axis' degree, for messages)
  const char* degree_letter;  // "D", "T", "n" (first axis), labels "TSP D=4", "Ulysses n=4"
  // Whether cost::device_memory (the whole-model estimate `plan` prints) models it.
  bool device_estimate;

  // The strategy of `ranks` ranks (one_axis) or of the tp × sp grid.
  cost::Strategy (*make)(int ranks, int tp, int sp);
  // The first rule the shape breaks, or nullopt.
  std::optional<Violation> (*rules)(const cost::ModelShape& m, const cost::Strategy& st,
                                    const RuleOptions& o);
  // The paper convention's forward volume per layer per rank, elements (TSP-NOTES.md table).
  double (*paper_forward_elements)(const cost::ModelShape& m, const cost::Strategy& st);
  // One layer's traffic on `rank`, counted like the runtime (cost_model.hpp); unchecked input.
  cost::LayerTraffic (*layer_traffic)(const cost::ModelShape& m, const cost::Strategy& st,
                                      const cost::ElementSizes& es, const cost::CostOptions& o,
                                      int rank);
  // The block factory: where `rank` sits, and its layer built from the master weights.
  RankPlacement (*place)(const LayerProblem& p, const cost::Strategy& st, int rank);
  std::unique_ptr<RankLayer> (*make_layer)(Rank& rank, const LayerProblem& p,
                                           const cost::Strategy& st,
                                           const ref::LayerWeights<float>& master);
  // The whole-model factory: `rank`'s model (p.model.n_layers layers of make_layer) from the
  // master weights; the rules with RuleOptions::whole_model must hold.
  std::unique_ptr<RankModel> (*make_model)(Rank& rank, const LayerProblem& p,
                                           const cost::Strategy& st,
                                           const ref::ModelWeights<float>& master);
  // The traffic of the model's embedding, final norm, LM head and loss on `rank` (cost_model.hpp,
  // the closed form of make_model's part outside the layers); unchecked input.
  cost::VocabTraffic (*vocab_traffic)(const cost::ModelShape& m, const cost::Strategy& st,
                                      const cost::ElementSizes& es, int rank);
};

// Every strategy, in table order.
std::span<const StrategyInfo> strategies();
const StrategyInfo& strategy_info(cost::Scheme s);
// By CLI name; std::invalid_argument "unknown strategy 'x' (known: tsp, tp, ...)" otherwise.
const StrategyInfo& strategy_named(std::string_view name);
// "tsp, tp, megatron-sp, sp, ulysses, ring, tp-sp"
std::string strategy_names();

// The strategies at n ranks, in table order: one per one-axis entry, and every T × Sp
// factorization with 1 < T < n of a grid entry.
std::vector<cost::Strategy> strategies_at(int n);

// strategy_info(st.scheme).rules, for the common case.
std::optional<Violation> violation(const cost::ModelShape& m, const cost::Strategy& st,
                                   const RuleOptions& o = {});

}  // namespace tspemu::tsp
