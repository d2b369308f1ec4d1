#include "tspemu/plan/strategy_table.hpp"

#include <stdexcept>
#include <string>
#include <utility>

namespace tspemu::tsp {

namespace {

using i64 = std::int64_t;
using cost::ModelShape;
using cost::Scheme;
using cost::Strategy;
using Found = std::optional<Violation>;

std::string s(i64 v) {
  return std::to_string(v);
}

// ---- Rules ----------------------------------------------------------------------------------

Found degree_rule(int d, const std::string& letter, Axis axis) {
  if (d >= 1) return std::nullopt;
  return Violation{Quantity::degree, d, 1, letter, axis, "", letter + "=" + s(d) + " must be >= 1"};
}

// Degree d shards the heads and the MLP width: each rank owns whole query and KV heads.
Found shard_rules(const ModelShape& m, int d, const std::string& letter, Axis axis) {
  if (Found v = degree_rule(d, letter, axis)) return v;
  // A violation unless d divides the quantity `name`=value; `why` ends its message.
  auto must_divide = [&](Quantity q, i64 value, const std::string& name, const char* why) -> Found {
    if (value % d == 0) return std::nullopt;
    std::string message = letter + "=" + s(d) + " does not divide " + name + "=" + s(value) + why;
    return Violation{q, value, d, letter, axis, "", std::move(message)};
  };
  if (Found v =
          must_divide(Quantity::heads, m.n_heads, "n_heads", " (each rank owns whole query heads)"))
    return v;
  if (Found v = must_divide(Quantity::kv_heads, m.n_kv_heads, "n_kv_heads",
                            " (each rank owns whole KV heads)"))
    return v;
  return must_divide(Quantity::ffn, m.ffn, "the MLP width ffn", "");
}

// Degree d shards the sequence; the zigzag layout cuts it into 2d chunks.
Found sequence_rules(const ModelShape& m, int d, const std::string& letter, Axis axis, bool zigzag,
                     const char* layout) {
  if (Found v = degree_rule(d, letter, axis)) return v;
  const i64 chunks = 2 * static_cast<i64>(d);
  if (zigzag && m.S % chunks != 0)
    return Violation{
        Quantity::seq,
        m.S,
        chunks,
        "2·" + letter,
        axis,
        "for the zigzag layout",
        "zigzag layout needs S=" + s(m.S) + " divisible by 2·" + letter + "=" + s(chunks)};
  if (m.S % d != 0)
    return Violation{Quantity::seq,
                     m.S,
                     d,
                     letter,
                     axis,
                     layout ? std::string("for the ") + layout + " layout" : "",
                     "S=" + s(m.S) + " is not divisible by " + letter + "=" + s(d)};
  return std::nullopt;
}

// The whole model's embedding and LM head cut into d shards of rows (tsp_model.hpp,
// mesh_model.hpp): d | vocab.
Found vocab_rule(const ModelShape& m, int d, const std::string& letter, const RuleOptions& o) {
  if (!o.whole_model || (m.vocab >= 1 && m.vocab % d == 0)) return std::nullopt;
  return Violation{Quantity::vocab,
                   m.vocab,
                   d,
                   letter,
                   Axis::first,
                   "",
                   m.vocab < 1 ? "vocab=" + s(m.vocab) + " must be >= 1"
                               : letter + "=" + s(d) + " does not divide vocab=" + s(m.vocab) +
                                     " (each rank owns V/" + letter + " embedding rows)"};
}

Found tsp_rules(const ModelShape& m, const Strategy& st, const RuleOptions& o) {
  const int D = st.D;
  if (Found v = shard_rules(m, D, "D", Axis::first)) return v;
  const bool zigzag = o.layout_rules && o.tsp_layout == LayoutKind::zigzag;
  if (Found v = sequence_rules(m, D, "D", Axis::first, zigzag,
                               o.layout_rules ? layout_name(o.tsp_layout) : nullptr))
    return v;
  const i64 kv_per_shard = m.n_kv_heads / D;
  if (o.head_buckets < 1 || kv_per_shard % o.head_buckets != 0)
    return Violation{Quantity::head_buckets,
                     kv_per_shard,
                     o.head_buckets,
                     "D",
                     Axis::first,
                     "",
                     "head_buckets=" + s(o.head_buckets) + " must divide the " + s(kv_per_shard) +
                         " KV heads of a shard (n_kv_heads/D)"};
  return vocab_rule(m, D, "D", o);
}

// A T × Sp mesh (tp, megatron-sp, sp, tp-sp): T shards heads and MLP, Sp the sequence in zigzag
// rows; Megatron-SP further cuts a row's S/Sp tokens into T pieces.
template <bool SequenceParallel>
Found mesh_rules(const ModelShape& m, const Strategy& st, const RuleOptions& o) {
  if (Found v = shard_rules(m, st.T, "T", Axis::first)) return v;
  if (Found v = sequence_rules(m, st.Sp, "Sp", Axis::sp, o.layout_rules && st.Sp > 1, nullptr))
    return v;
  if (SequenceParallel && (m.S / st.Sp) % st.T != 0)
    return Violation{Quantity::seq,
                     m.S,
                     st.T,
                     "T",
                     Axis::first,
                     "for Megatron sequence parallelism",
                     "sequence parallelism needs S/Sp=" + s(m.S / st.Sp) +
                         " tokens per row divisible by T=" + s(st.T)};
  return vocab_rule(m, st.T, "T", o);
}

// Ulysses: n ranks each attend whole query and KV heads of the full sequence.
Found ulysses_rules(const ModelShape& m, const Strategy& st, const RuleOptions& o) {
  const int n = st.Sp;
  if (Found v = degree_rule(n, "n", Axis::first)) return v;
  if (m.n_heads % n != 0 || m.n_kv_heads % n != 0)
    return Violation{m.n_heads % n != 0 ? Quantity::heads : Quantity::kv_heads,
                     m.n_heads % n != 0 ? m.n_heads : m.n_kv_heads,
                     n,
                     "n",
                     Axis::first,
                     "",
                     "n=" + s(n) + " ranks must divide n_heads=" + s(m.n_heads) +
                         " and n_kv_heads=" + s(m.n_kv_heads) +
                         " (each rank attends whole query and KV heads)"};
  if (Found v = sequence_rules(m, n, "n", Axis::first, o.layout_rules && n > 1, nullptr)) return v;
  return vocab_rule(m, 1, "n", o);
}

// Ring attention: n ranks pass their K/V blocks round; any head count.
Found ring_rules(const ModelShape& m, const Strategy& st, const RuleOptions& o) {
  if (Found v = sequence_rules(m, st.Sp, "n", Axis::first, o.layout_rules && st.Sp > 1, nullptr))
    return v;
  return vocab_rule(m, 1, "n", o);
}

// ---- Paper-convention forward volumes (TSP-NOTES.md table), elements ----------------------

double tokens(const ModelShape& m) {
  return static_cast<double>(m.B * m.S);
}

double tsp_forward(const ModelShape& m, const Strategy& st) {
  // (D-1)/D·(2 + 2/g + 3F)·h² + 2(D-1)/D·B·S·h/g
  return cost::ring_volume(static_cast<double>(m.attention_params() + m.mlp_params()), st.D) +
         2 * cost::ring_volume(tokens(m) * static_cast<double>(m.kv_dim()), st.D);
}
double tp_forward(const ModelShape& m, const Strategy& st) {  // 4(T-1)/T·B·S·h
  return 4 * cost::ring_volume(tokens(m) * static_cast<double>(m.hidden), st.T);
}
double sp_forward(const ModelShape& m, const Strategy& st) {  // 2(Sp-1)/Sp·B·S·h/g
  return 2 * cost::ring_volume(tokens(m) * static_cast<double>(m.kv_dim()), st.Sp);
}
double tp_sp_forward(const ModelShape& m, const Strategy& st) {
  // 4(T-1)/T·B·(S/Sp)·h + 2(Sp-1)/Sp·B·S·h/(g·T)
  return 4 * cost::ring_volume(tokens(m) / st.Sp * static_cast<double>(m.hidden), st.T) +
         2 * cost::ring_volume(tokens(m) * static_cast<double>(m.kv_dim()) / st.T, st.Sp);
}
double ulysses_forward(const ModelShape& m, const Strategy& st) {
  // Q and the output, then K and V, each B·(S/n) tokens: (n-1)/n · B·(S/n)·(2h + 2h/g)
  const double local = tokens(m) / st.Sp;
  return 2 * cost::ring_volume(local * static_cast<double>(m.q_dim()), st.Sp) +
         2 * cost::ring_volume(local * static_cast<double>(m.kv_dim()), st.Sp);
}
// Ring attention: n-1 hops of the B·(S/n)-token K/V block, SP's volume by sendrecv.

// ---- The table ------------------------------------------------------------------------------

Strategy make_tsp(int n, int, int) {
  return Strategy::tsp(n);
}
Strategy make_tp(int n, int, int) {
  return Strategy::tp(n);
}
Strategy make_megatron_sp(int n, int, int) {
  return Strategy::megatron_sp(n);
}
Strategy make_sp(int n, int, int) {
  return Strategy::sp(n);
}
Strategy make_ulysses(int n, int, int) {
  return Strategy::ulysses(n);
}
Strategy make_ring(int n, int, int) {
  return Strategy::ring(n);
}
Strategy make_tp_sp(int, int tp, int sp) {
  return Strategy::tp_sp(tp, sp);
}

// Indexed by cost::Scheme (checked below).
constexpr StrategyInfo kTable[] = {
    {Scheme::tsp, "tsp", "TSP",
     "tensor and sequence parallelism folded onto one axis of D ranks: weight shards broadcast, "
     "K/V all-gathered, MLP shards passed round a ring",
     MeshKind::one_axis, "the TSP degree", "D", true, make_tsp, tsp_rules, tsp_forward,
     cost::tsp_layer_traffic, cost::tsp_vocab_traffic},
    {Scheme::tp, "tp", "TP",
     "Megatron tensor parallelism: heads and MLP columns over T = D ranks, tokens replicated, "
     "an all-reduce per block",
     MeshKind::one_axis, "the tensor-parallel degree", "T", true, make_tp, mesh_rules<false>,
     tp_forward, cost::mesh_layer_traffic, cost::mesh_vocab_traffic},
    {Scheme::megatron_sp, "megatron-sp", "TP+Megatron-SP",
     "TP with Megatron sequence parallelism: each all-reduce split into reduce-scatter + "
     "all-gather, norms on sequence pieces",
     MeshKind::one_axis, "the tensor-parallel degree", "T", true, make_megatron_sp,
     mesh_rules<true>, tp_forward, cost::mesh_layer_traffic, cost::mesh_vocab_traffic},
    {Scheme::sp, "sp", "SP",
     "context parallelism: weights replicated, tokens zigzag-sharded over Sp = D ranks, K/V "
     "all-gathered",
     MeshKind::one_axis, "the sequence-parallel degree", "Sp", true, make_sp, mesh_rules<false>,
     sp_forward, cost::mesh_layer_traffic, cost::mesh_vocab_traffic},
    {Scheme::ulysses, "ulysses", "Ulysses",
     "DeepSpeed-Ulysses: SP whose attention trades the sequence axis for the head axis by "
     "all-to-all (n = D must divide the KV heads)",
     MeshKind::one_axis, "the Ulysses degree", "n", false, make_ulysses, ulysses_rules,
     ulysses_forward, cost::sequence_sharded_layer_traffic, cost::mesh_vocab_traffic},
    {Scheme::ring, "ring", "Ring attention",
     "ring attention: SP whose K/V blocks pass round the ring, partial outputs merged by "
     "log-sum-exp",
     MeshKind::one_axis, "the ring attention degree", "n", false, make_ring, ring_rules, sp_forward,
     cost::sequence_sharded_layer_traffic, cost::mesh_vocab_traffic},
    {Scheme::tp_sp, "tp-sp", "TP+SP", "a --tp T x --sp Sp mesh: TP inside a row, SP across rows",
     MeshKind::grid, "the tensor-parallel degree", "T", true, make_tp_sp, mesh_rules<false>,
     tp_sp_forward, cost::mesh_layer_traffic, cost::mesh_vocab_traffic},
};

static_assert(indexed_by_scheme(kTable),
              "one entry per cost::Scheme, kTable[i] describing value i");

}  // namespace

std::span<const StrategyInfo> strategies() {
  return kTable;
}

const StrategyInfo& strategy_info(Scheme s) {
  const auto i = static_cast<std::size_t>(s);
  if (i >= std::size(kTable))
    throw std::invalid_argument("strategy table: no entry for scheme " + std::to_string(i));
  return kTable[i];
}

std::string strategy_names() {
  std::string names;
  for (const StrategyInfo& e : kTable) names += (names.empty() ? "" : ", ") + std::string(e.name);
  return names;
}

const StrategyInfo& strategy_named(std::string_view name) {
  for (const StrategyInfo& e : kTable)
    if (name == e.name) return e;
  throw std::invalid_argument("unknown strategy '" + std::string(name) +
                              "' (known: " + strategy_names() + ")");
}

std::vector<Strategy> strategies_at(int n) {
  std::vector<Strategy> v;
  for (const StrategyInfo& e : kTable) {
    if (e.mesh == MeshKind::one_axis) {
      v.push_back(e.make(n, 0, 0));
      continue;
    }
    for (int T = 2; T < n; ++T)
      if (n % T == 0) v.push_back(e.make(0, T, n / T));
  }
  return v;
}

Found violation(const ModelShape& m, const Strategy& st, const RuleOptions& o) {
  return strategy_info(st.scheme).rules(m, st, o);
}

}  // namespace tspemu::tsp
