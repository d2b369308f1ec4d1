#include "problem_options.hpp"

#include <CLI/CLI.hpp>

#include "tspemu/plan/strategy_table.hpp"
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
                 "vocabulary size (whole model only; divisible by the TSP/TP degree, which "
                 "shards the embedding and LM head)")
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
  app.add_flag("--serial-attention", o.serial_attention,
               "TSP: the serial attention schedule (no prefetching broadcast, no reduce under the "
               "next shard's compute; bitwise the same results)");
  app.add_flag("--pin", o.pin, "pin rank i's thread to core i mod cores");
  app.add_option("--precision", o.precision,
                 "numeric precision: fp32, or bf16 (Megatron-LM's mixed precision: bf16 weights, "
                 "activations and KV cache; fp32 GEMM accumulation, softmax, norms, gradients, "
                 "master weights and AdamW state; not implemented yet, refused)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.parse_complete_callback([&o, name = app.get_name()] { precision_policy(o, name); });
}

void add_grad_reduce_option(CLI::App& app, ProblemOptions& o) {
  app.add_option("--grad-reduce", o.grad_reduce,
                 "type of the weight-gradient buffers and their reduction: fp32 (the default), or "
                 "bf16 with --precision bf16 (Megatron-LM's --grad-reduce-in-bf16)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
}

PrecisionPolicy precision_policy(const ProblemOptions& o, const std::string& command) {
  const std::optional<NumType> storage = parse_num_type(o.precision);
  if (!storage) throw ConfigError("--precision " + o.precision + ": must be fp32 or bf16");
  PrecisionPolicy p =
      *storage == NumType::bf16 ? PrecisionPolicy::megatron_bf16() : PrecisionPolicy::fp32();
  if (!o.grad_reduce.empty()) {
    const std::optional<NumType> wire = parse_num_type(o.grad_reduce);
    if (!wire) throw ConfigError("--grad-reduce " + o.grad_reduce + ": must be fp32 or bf16");
    p = p.with_grad_reduce(*wire);
  }
  if (const std::string why = p.conflict(); !why.empty())
    throw ConfigError("--grad-reduce " + o.grad_reduce + " with --precision " + o.precision +
                      ": an fp32 run keeps and reduces its gradients in fp32 (" + why +
                      "); use --grad-reduce bf16 only with --precision bf16");
  if (p.storage == NumType::bf16)
    throw ConfigError(command +
                      " --precision bf16: bf16 mixed precision is not implemented yet "
                      "(the reference, the strategies and the collectives compute and store fp32 "
                      "only); run with --precision fp32, the default");
  return p;
}

void add_strategy_options(CLI::App& app, ProblemOptions& o) {
  std::string help;
  std::vector<std::string> names;
  for (const tsp::StrategyInfo& e : tsp::strategies()) {
    help += std::string(help.empty() ? "" : "\n") + e.name + ": " + e.description;
    names.emplace_back(e.name);
  }
  app.add_option("--strategy", o.strategy, help)
      ->capture_default_str()
      ->check(CLI::IsMember(names));
  app.add_option("--ranks,-D", o.ranks, "ranks: the degree of every strategy but tp-sp")
      ->capture_default_str();
  app.add_option("--tp", o.tp, "tp-sp: tensor-parallel degree T (ranks in a row)")
      ->capture_default_str();
  app.add_option("--sp", o.sp, "tp-sp: sequence-parallel degree Sp (ranks in a column)")
      ->capture_default_str();
}

cost::Strategy parse_strategy(const ProblemOptions& o) {
  const tsp::StrategyInfo* info = nullptr;
  try {
    info = &tsp::strategy_named(o.strategy);
  } catch (const std::invalid_argument& e) {
    throw ConfigError("--strategy " + o.strategy + ": " + e.what());
  }
  // The degrees first, in 64 bits: a mesh past the world's limit is the degrees' fault (a shape
  // rule would blame --heads), and T·Sp can overflow an int.
  const bool grid = info->mesh == tsp::MeshKind::grid;
  const std::int64_t n = grid ? std::int64_t{o.tp} * std::int64_t{o.sp} : std::int64_t{o.ranks};
  if (n < 1 || n > kMaxRanks || (grid && (o.tp < 1 || o.sp < 1)))
    throw ConfigError(
        (grid ? "--tp " + std::to_string(o.tp) + " --sp " + std::to_string(o.sp) + ": the mesh has "
              : "--ranks " + std::to_string(o.ranks) + ": ") +
        std::to_string(n) + " ranks; a world has 1 to " + std::to_string(kMaxRanks));
  try {
    return info->make(o.ranks, o.tp, o.sp);
  } catch (const std::invalid_argument& e) {
    throw ConfigError("--strategy " + o.strategy + ": " + e.what());
  }
}

namespace {

std::string flag(const char* name, long long v) {
  return std::string(name) + " " + std::to_string(v);
}

// The flag that sets the degree a rule's divisor comes from.
std::string degree_flag(const cost::Strategy& st, tsp::Axis axis) {
  if (tsp::strategy_info(st.scheme).mesh != tsp::MeshKind::grid) return flag("--ranks", st.ranks());
  return axis == tsp::Axis::first ? flag("--tp", st.T) : flag("--sp", st.Sp);
}

// A broken rule of the strategy table, said in terms of the flags.
std::string flag_message(const tsp::Violation& v, const cost::Strategy& st) {
  const std::string by =
      v.divisor_label + " = " + std::to_string(v.divisor) + " (" + degree_flag(st, v.axis) + ")";
  const std::string degree = std::string(tsp::strategy_info(st.scheme).degree_name) + " " + by;
  switch (v.quantity) {
    case tsp::Quantity::heads:
      return flag("--heads", v.value) + ": the query heads must be divisible by " + degree;
    case tsp::Quantity::kv_heads:
      return flag("--kv-heads", v.value) + ": the key/value heads must be divisible by " + degree;
    case tsp::Quantity::ffn:
      return flag("--ffn", v.value) + ": the MLP width must be divisible by " + degree;
    case tsp::Quantity::vocab:
      return flag("--vocab", v.value) + ": the vocabulary must be divisible by " + degree;
    case tsp::Quantity::seq:
      return flag("--seq", v.value) + ": S must be divisible by " + v.divisor_label + " = " +
             std::to_string(v.divisor) + (v.purpose.empty() ? "" : " " + v.purpose) + " (" +
             degree_flag(st, v.axis) + ")";
    case tsp::Quantity::head_buckets:
      return flag("--head-buckets", v.divisor) + ": must divide the KV heads per rank " +
             std::to_string(v.value);
    case tsp::Quantity::degree:
      return degree_flag(st, v.axis) + ": " + v.message;
  }
  return v.message;
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

  const bool grid = tsp::strategy_info(st.scheme).mesh == tsp::MeshKind::grid;
  if (st.D < 1 || st.T < 1 || st.Sp < 1 || st.ranks() > kMaxRanks)
    return degree_flag(st, grid && st.T >= 1 && st.Sp < 1 ? tsp::Axis::sp : tsp::Axis::first) +
           ": the ranks must be 1 to " + std::to_string(kMaxRanks);
  const tsp::RuleOptions rules{.tsp_layout = tsp::parse_layout(o.layout),
                               .head_buckets = o.head_buckets,
                               .whole_model = whole_model};
  if (const auto v = tsp::violation(cost::ModelShape::from(m, o.B, o.S), st, rules))
    return flag_message(*v, st);
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
  c.overlap = !o.serial_attention;
  c.seed = o.seed;
  c.pin = o.pin;
  try {
    validate_stack(c);  // what the library requires beyond the checks above
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("configuration rejected: ") + e.what());
  }
  return c;
}

void add_sim_clock_options(CLI::App& app, SimClockArgs& a, bool with_nodes) {
  app.add_option("--sim-clock", a.preset,
                 std::string("also estimate the step on a GPU cluster model (sim_clock.hpp): ") +
                     SimClockModel::kPresetNames +
                     "; nvlink and network are one link level, the others two (8 per node)");
  app.add_option("--peak", a.peak_tflops, "simulated clock: peak dense TFLOP/s per device");
  app.add_option("--mfu", a.mfu, "simulated clock: fraction of peak compute reaches, (0, 1]");
  app.add_option("--gpus-per-node", a.gpus_per_node, "simulated clock: devices per node (0: one)");
  app.add_option("--intra-alpha-us", a.intra_alpha_us, "simulated clock: intra-node latency, us");
  app.add_option("--intra-beta-gbs", a.intra_beta_gbs,
                 "simulated clock: intra-node bandwidth per device and direction, GB/s");
  app.add_option("--inter-alpha-us", a.inter_alpha_us, "simulated clock: inter-node latency, us");
  app.add_option("--inter-beta-gbs", a.inter_beta_gbs,
                 "simulated clock: inter-node bandwidth per device (NIC), GB/s");
  if (with_nodes)
    app.add_option("--nodes", a.nodes,
                   "simulated clock: spread each strategy's ranks contiguously over N nodes "
                   "(ranks / N per node; a TP+SP mesh is row-major, so its TP rows stay in a node "
                   "and its SP axis crosses nodes when T divides ranks / N)");
}

std::optional<SimClockModel> sim_clock_option(const SimClockArgs& a, int ranks) {
  const bool overrides = a.peak_tflops >= 0 || a.mfu >= 0 || a.gpus_per_node >= 0 ||
                         a.intra_alpha_us >= 0 || a.intra_beta_gbs >= 0 || a.inter_alpha_us >= 0 ||
                         a.inter_beta_gbs >= 0 || a.nodes != 0;
  if (a.preset.empty()) {
    if (overrides) throw ConfigError("--peak, --mfu, link and node flags need --sim-clock");
    return std::nullopt;
  }
  std::optional<SimClockModel> m = SimClockModel::preset(a.preset);
  if (!m)
    throw ConfigError("--sim-clock " + a.preset + ": unknown model (" +
                      SimClockModel::kPresetNames + ")");
  if (a.peak_tflops >= 0) m->peak_flops = a.peak_tflops * 1e12;
  if (a.mfu >= 0) m->mfu = a.mfu;
  if (a.gpus_per_node >= 0) m->gpus_per_node = a.gpus_per_node;
  if (a.intra_alpha_us >= 0) m->alpha_s = a.intra_alpha_us * 1e-6;
  if (a.intra_beta_gbs >= 0) m->beta_bytes_s = a.intra_beta_gbs * 1e9;
  if (a.inter_alpha_us >= 0) m->inter_alpha_s = a.inter_alpha_us * 1e-6;
  if (a.inter_beta_gbs >= 0) m->inter_beta_bytes_s = a.inter_beta_gbs * 1e9;
  if (a.nodes != 0) {
    if (a.nodes < 1 || ranks % a.nodes != 0)
      throw ConfigError("--nodes " + std::to_string(a.nodes) + ": must be >= 1 and divide the " +
                        std::to_string(ranks) + " ranks");
    m->gpus_per_node = ranks / a.nodes;
    m->name += " on " + std::to_string(a.nodes) + " nodes";
  }
  try {
    m->validate(ranks);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("--sim-clock ") + a.preset + " with overrides: " + e.what());
  }
  return m;
}

}  // namespace tspemu::app
