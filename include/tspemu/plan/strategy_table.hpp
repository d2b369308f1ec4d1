// The strategy table: what tspemu's planner knows about each parallel strategy, in one entry
// each — its name as the CLI spells it, a one-line description, its mesh (how the ranks split into
// TP × SP), its divisibility rules and its traffic formulas (the cost model's closed forms). The
// blocks' validation (tsp::TspShape, tsp::BaselineShape, the Ulysses core), the cost model and the
// `tspemu` commands all ask this table, so a rule or a name is stated once. The blocks and whole
// models each strategy builds are the other half of its entry, in tsp/strategy.hpp (tsp/ builds on
// plan/, never the reverse).
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
// Adding a strategy: a cost::Scheme value (cost_model.hpp, in table order), its entry in
// strategy_table.cpp and its blocks' entry in tsp/strategy.cpp. The entry points at functions: the
// divisibility rules and the paper-convention forward volume live in strategy_table.cpp; the
// runtime-counted layer traffic is a cost-model function per family of blocks (cost_model.hpp;
// each rejects a strategy outside its family). A strategy built from existing blocks needs nothing
// else: the commands, the option parser and the blocks' validation read the table. A new family
// of blocks also needs its layer_traffic closed form and, while `run` checks weights and gradients
// against the cost model's arena replay (tsp_layer_memory, baseline_layer_memory), a replay of its
// allocations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tspemu/plan/cost_model.hpp"
#include "tspemu/plan/layout_kind.hpp"

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
  // The traffic of the model's embedding, final norm, LM head and loss on `rank` (cost_model.hpp,
  // the closed form of the whole model's part outside the layers); unchecked input.
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

// Whether a table indexed by cost::Scheme has one entry per scheme, entry i describing scheme i:
// the planner's table and the blocks' table (tsp/strategy.cpp) assert it at compile time.
template <class Entry, std::size_t N>
constexpr bool indexed_by_scheme(const Entry (&table)[N]) {
  if (N != static_cast<std::size_t>(cost::Scheme::tp_sp) + 1) return false;
  for (std::size_t i = 0; i < N; ++i)
    if (static_cast<std::size_t>(table[i].scheme) != i) return false;
  return true;
}

// strategy_info(st.scheme).rules, for the common case.
std::optional<Violation> violation(const cost::ModelShape& m, const cost::Strategy& st,
                                   const RuleOptions& o = {});

}  // namespace tspemu::tsp
