#include "problem_options.hpp"

#include "tspemu/runtime/world.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

ProblemOptions::ProblemOptions() {
  model.vocab = 1024;
  model.hidden = 256;
  model.n_layers = 2;
  model.n_heads = 8;
  model.n_kv_heads = 4;
  model.ffn = 704;
}

void add_problem_options(CLI::App& app, ProblemOptions& o) {
  auto& m = o.model;
  app.add_option("--layers,-L", m.n_layers, "layers L")->capture_default_str();
  app.add_option("--hidden", m.hidden, "hidden size h")->capture_default_str();
  app.add_option("--heads", m.n_heads, "query heads (divisible by the TP/TSP degree)")
      ->capture_default_str();
  app.add_option("--kv-heads", m.n_kv_heads,
                 "key/value heads (dividing --heads; divisible by the TP/TSP degree)")
      ->capture_default_str();
  app.add_option("--ffn", m.ffn, "gated-MLP width (divisible by the TP/TSP degree)")
      ->capture_default_str();
  app.add_option("--vocab", m.vocab,
                 "vocabulary size (whole-model TSP run only; divisible by --ranks)")
      ->capture_default_str();
  app.add_flag("--tied", m.tie_embeddings, "tie the LM head to the embedding (whole model)");
  app.add_option("--batch,-B", o.B, "micro-batch B")->capture_default_str();
  app.add_option("--seq,-S", o.S,
                 "sequence length S (zigzag: divisible by 2·D, resp. 2·Sp for SP and TP+SP, 2·n "
                 "for Ulysses and ring)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "weights and inputs seed")->capture_default_str();
  app.add_option("--layout", o.layout, "TSP sequence layout (the baselines use zigzag)")
      ->capture_default_str()
      ->check(CLI::IsMember({"zigzag", "contiguous", "striped"}));
  app.add_option("--head-buckets", o.head_buckets,
                 "TSP: K/V all-gathers per head shard (dividing kv-heads / D)")
      ->capture_default_str();
  app.add_flag("--pin", o.pin, "pin rank i's thread to core i mod cores");
}

void add_strategy_options(CLI::App& app, ProblemOptions& o) {
  app.add_option("--strategy", o.strategy,
                 "tsp, tp (Megatron), megatron-sp (TP + sequence parallel), sp (context "
                 "parallel, K/V all-gathered), tp-sp (a --tp x --sp mesh), ulysses (DeepSpeed-"
                 "Ulysses: sequence<->heads all-to-all) or ring (ring attention: K/V blocks "
                 "passed round)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tsp", "tp", "megatron-sp", "sp", "tp-sp", "ulysses", "ring"}));
  app.add_option("--ranks,-D", o.ranks,
                 "ranks: the degree of tsp, tp, megatron-sp, sp, ulysses and ring")
      ->capture_default_str();
  app.add_option("--tp", o.tp, "tp-sp: tensor-parallel degree T (ranks in a row)")
      ->capture_default_str();
  app.add_option("--sp", o.sp, "tp-sp: sequence-parallel degree Sp (ranks in a column)")
      ->capture_default_str();
}

const char* strategy_flag(cost::Scheme s) {
  switch (s) {
    case cost::Scheme::tsp:
      return "tsp";
    case cost::Scheme::tp:
      return "tp";
    case cost::Scheme::megatron_sp:
      return "megatron-sp";
    case cost::Scheme::sp:
      return "sp";
    case cost::Scheme::tp_sp:
      return "tp-sp";
    case cost::Scheme::ulysses:
      return "ulysses";
    case cost::Scheme::ring:
      return "ring";
  }
  return "?";
}

cost::Strategy parse_strategy(const ProblemOptions& o) {
  if (o.strategy == "tsp") return cost::Strategy::tsp(o.ranks);
  if (o.strategy == "tp") return cost::Strategy::tp(o.ranks);
  if (o.strategy == "megatron-sp") return cost::Strategy::megatron_sp(o.ranks);
  if (o.strategy == "sp") return cost::Strategy::sp(o.ranks);
  if (o.strategy == "tp-sp") return cost::Strategy::tp_sp(o.tp, o.sp);
  if (o.strategy == "ulysses") return cost::Strategy::ulysses(o.ranks);
  if (o.strategy == "ring") return cost::Strategy::ring(o.ranks);
  throw ConfigError("--strategy " + o.strategy +
                    ": must be tsp, tp, megatron-sp, sp, tp-sp, ulysses or ring");
}

namespace {

std::string flag(const char* name, long long v) {
  return std::string(name) + " " + std::to_string(v);
}

}  // namespace

std::string why_invalid(const ProblemOptions& o, const cost::Strategy& st, bool whole_model) {
  const auto& m = o.model;
  if (m.n_layers < 1) return flag("--layers", m.n_layers) + ": L must be at least 1";
  if (m.n_heads < 1) return flag("--heads", m.n_heads) + ": must be at least 1";
  if (m.hidden < 1 || m.hidden % m.n_heads != 0)
    return flag("--hidden", m.hidden) + ": h must be a positive multiple of --heads " +
           std::to_string(m.n_heads);
  if ((m.hidden / m.n_heads) % 2 != 0)
    return flag("--hidden", m.hidden) +
           ": the head size h / --heads = " + std::to_string(m.hidden / m.n_heads) +
           " must be even (RoPE rotates pairs)";
  if (m.n_kv_heads < 1 || m.n_heads % m.n_kv_heads != 0)
    return flag("--kv-heads", m.n_kv_heads) + ": must divide --heads " + std::to_string(m.n_heads);
  if (m.ffn < 1) return flag("--ffn", m.ffn) + ": must be at least 1";
  if (o.B < 1) return flag("--batch", o.B) + ": B must be at least 1";
  if (o.S < 1) return flag("--seq", o.S) + ": S must be at least 1";

  const bool is_tsp = st.scheme == cost::Scheme::tsp;
  const bool mesh = st.scheme == cost::Scheme::tp_sp;
  const int T = is_tsp ? st.D : st.T;
  const std::string tflag = mesh ? flag("--tp", T) : flag("--ranks", is_tsp ? st.D : st.ranks());
  const std::string sflag = mesh ? flag("--sp", st.Sp) : flag("--ranks", st.Sp);
  if (T < 1 || st.Sp < 1 || st.ranks() > kMaxRanks)
    return (T < 1       ? tflag
            : st.Sp < 1 ? sflag
                        : tflag) +
           ": the ranks must be 1 to " + std::to_string(kMaxRanks);
  const std::string degree =
      std::string(is_tsp ? "the TSP degree D = " : "the tensor-parallel degree T = ") +
      std::to_string(T) + " (" + tflag + ")";
  if (m.n_heads % T != 0)
    return flag("--heads", m.n_heads) + ": the query heads must be divisible by " + degree;
  if (m.n_kv_heads % T != 0)
    return flag("--kv-heads", m.n_kv_heads) + ": the key/value heads must be divisible by " +
           degree;
  if (m.ffn % T != 0)
    return flag("--ffn", m.ffn) + ": the MLP width must be divisible by " + degree;
  if (is_tsp) {
    const int need = o.layout == "zigzag" ? 2 * st.D : st.D;
    if (o.S % need != 0)
      return flag("--seq", o.S) + ": S must be divisible by " +
             (o.layout == "zigzag" ? "2·D = " : "D = ") + std::to_string(need) + " for the " +
             o.layout + " layout (" + tflag + ")";
    if (o.head_buckets < 1 || (m.n_kv_heads / st.D) % o.head_buckets != 0)
      return flag("--head-buckets", o.head_buckets) + ": must divide the KV heads per rank " +
             std::to_string(m.n_kv_heads / st.D);
    if (whole_model && (m.vocab < 1 || m.vocab % st.D != 0))
      return flag("--vocab", m.vocab) + ": the vocabulary must be divisible by " + degree;
  }
  if (st.scheme == cost::Scheme::ulysses) {
    const std::string n = "the Ulysses degree n = " + std::to_string(st.Sp) + " (" + sflag +
                          "; each rank attends whole heads)";
    if (m.n_heads % st.Sp != 0)
      return flag("--heads", m.n_heads) + ": the query heads must be divisible by " + n;
    if (m.n_kv_heads % st.Sp != 0)
      return flag("--kv-heads", m.n_kv_heads) + ": the key/value heads must be divisible by " + n;
  }
  if (st.Sp > 1 && o.S % (2 * st.Sp) != 0)
    return flag("--seq", o.S) + ": S must be divisible by " +
           (st.attention_core() ? "2·n = " : "2·Sp = ") + std::to_string(2 * st.Sp) +
           " for the zigzag layout (" + sflag + ")";
  if (st.scheme == cost::Scheme::megatron_sp && (o.S / st.Sp) % T != 0)
    return flag("--seq", o.S) + ": S must be divisible by T = " + std::to_string(T) +
           " for Megatron sequence parallelism (" + tflag + ")";
  return "";
}

StackConfig make_stack_config(const ProblemOptions& o, const cost::Strategy& st, bool whole_model) {
  if (const std::string why = why_invalid(o, st, whole_model); !why.empty()) throw ConfigError(why);
  StackConfig c;
  c.model = o.model;
  c.B = o.B;
  c.S = o.S;
  c.strategy = st;
  c.layout = tsp::parse_layout(o.layout);
  c.head_buckets = o.head_buckets;
  c.seed = o.seed;
  c.pin = o.pin;
  try {
    validate_stack(c);  // what the library requires beyond the checks above
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("configuration rejected: ") + e.what());
  }
  return c;
}

std::optional<SimClockModel> sim_clock_option(const std::string& name) {
  if (name.empty()) return std::nullopt;
  std::optional<SimClockModel> m = SimClockModel::preset(name);
  if (!m) throw ConfigError("--sim-clock " + name + ": unknown model (nvlink or network)");
  return m;
}

}  // namespace tspemu::app
