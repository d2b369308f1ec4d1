#include "plan_command.hpp"

#include <CLI/CLI.hpp>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <ostream>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <limits>

#include "output_files.hpp"
#include "plan_inference.hpp"
#include "plan_pipeline.hpp"
#include "problem_options.hpp"
#include "stack_report.hpp"
#include "svg_chart.hpp"
#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/tsp/layer_measure.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

namespace {

struct Preset {
  const char* name;
  std::int64_t hidden, layers, heads, kv_heads, ffn, vocab;
};

// The paper's 7B-class model (TSP-NOTES.md: F = 4 gated) and common published
// shapes.
constexpr Preset kPresets[] = {
    {"paper-7b", 4096, 32, 32, 32, std::int64_t{4} * 4096, 32000},
    {"llama2-7b", 4096, 32, 32, 32, 11008, 32000},
    {"llama3-8b", 4096, 32, 32, 8, 14336, 128256},
    {"llama2-13b", 5120, 40, 40, 40, 13824, 32000},
    {"llama3-70b", 8192, 80, 64, 8, 28672, 128256},
};

std::string seq_label(std::int64_t S) {
  return S % 1024 == 0 ? std::to_string(S / 1024) + "K" : std::to_string(S);
}

struct Row {
  cost::Strategy st;
  std::string skipped;
  cost::DeviceMemory mem;
  cost::LayerTraffic traffic;
};

// One strategy's layer run dry (--dry-run): peaks over every rank, rank 0's
// counters beside the closed form, and whether every rank's counters equal
// theirs.
struct DryRow {
  cost::Strategy st;
  std::string skipped;
  double seconds = 0;
  std::size_t peak = 0;
  std::array<std::size_t, kCategoryCount> category_peak{};
  bool match = true;
  TrafficCounters forward, backward;  // rank 0, measured
  cost::LayerTraffic model;           // rank 0, closed form
};

struct DryRun {
  std::vector<DryRow> rows;
  double max_rss_mib = 0;  // the process's, after the runs
};

// TSP's forward volume over TP's, and the paper's formula where it applies (g =
// 1, F = 4).
struct Ratio {
  double tsp_over_tp = 0;
  std::optional<double> paper;
};

// Everything `plan` reports for one sequence length.
struct PlanTable {
  std::int64_t S = 0;
  std::vector<Row> rows;
  std::optional<Ratio> ratio;  // when both TSP and TP are modelled
  std::vector<std::pair<cost::Strategy, cost::StepTime>> times;
  std::optional<DryRun> dry;
};

// The whole report: computed first, then rendered as text, JSON and SVG.
struct PlanReport {
  const PlanArgs* args = nullptr;
  double capacity = 0;  // bytes per device
  double unit = 1;      // bytes per table unit
  cost::MemoryAssumptions as;
  cost::DeviceModel dev;
  int total = 0;       // devices in all (replicas × devices)
  cost::ModelShape m;  // at the longest sequence
  std::vector<PlanTable> tables;
};

std::vector<Row> plan_rows(const cost::ModelShape& m, int n, const cost::MemoryAssumptions& as) {
  std::vector<Row> rows;
  for (const cost::Strategy& st : tsp::strategies_at(n)) {
    if (!tsp::strategy_info(st.scheme).device_estimate) continue;
    Row r{st, {}, {}, {}};
    try {
      r.mem = cost::device_memory(m, st, as);
      cost::ElementSizes es = cost::ElementSizes::bf16();
      es.activation = as.precision.activation;
      es.weight = as.precision.weight;
      es.gradient = as.precision.gradient;
      r.traffic = cost::layer_traffic(m, st, es);
    } catch (const std::invalid_argument& e) {
      r.skipped = e.what();
    }
    rows.push_back(r);
  }
  return rows;
}

ref::ModelConfig layer_config(const cost::ModelShape& m) {
  auto narrow = [](std::int64_t v, const char* what) {
    if (v > std::numeric_limits<int>::max())
      throw ConfigError(std::string("--dry-run: ") + what + " " + std::to_string(v) +
                        " exceeds the blocks' int range");
    return static_cast<int>(v);
  };
  ref::ModelConfig c;
  c.hidden = narrow(m.hidden, "hidden");
  c.n_heads = narrow(m.n_heads, "heads");
  c.n_kv_heads = narrow(m.n_kv_heads, "kv heads");
  c.ffn = narrow(m.ffn, "ffn");
  c.vocab = narrow(m.vocab, "vocab");
  c.n_layers = 1;
  return c;
}

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

DryRow dry_row(const ref::ModelConfig& model, const cost::ModelShape& m, const cost::Strategy& st) {
  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  DryRow d;
  d.st = st;
  tsp::LayerMeasure got;
  try {
    got = tsp::measure_layer(model, static_cast<int>(m.B), static_cast<int>(m.S), st);
  } catch (const std::invalid_argument& e) {
    d.skipped = e.what();
    return d;
  }
  d.seconds = got.seconds;
  for (int r = 0; r < st.ranks(); ++r) {
    const tsp::RankLayerMeasure& g = got.ranks[static_cast<std::size_t>(r)];
    for (const ArenaStats* pass : {&g.forward, &g.backward}) {
      d.peak = std::max(d.peak, pass->peak);
      for (std::size_t c = 0; c < kCategoryCount; ++c)
        d.category_peak[c] = std::max(d.category_peak[c], pass->category_peak[c]);
    }
    const cost::LayerTraffic t = cost::layer_traffic(m, st, es, {}, r);
    d.match = d.match && g.forward_traffic == t.forward && g.backward_traffic == t.backward;
  }
  d.forward = got.ranks[0].forward_traffic;
  d.backward = got.ranks[0].backward_traffic;
  d.model = cost::layer_traffic(m, st, es, {}, 0);
  return d;
}

// One layer of every strategy's real blocks, dry, at m's size.
DryRun dry_run(const cost::ModelShape& m, int n) {
  const ref::ModelConfig model = layer_config(m);
  DryRun run;
  for (const cost::Strategy& st : tsp::strategies_at(n)) run.rows.push_back(dry_row(model, m, st));
  run.max_rss_mib = static_cast<double>(max_rss_kib()) / 1024.0;
  return run;
}

PlanTable plan_table(const PlanReport& r, cost::ModelShape m, std::int64_t S) {
  m.S = S;
  PlanTable t;
  t.S = S;
  t.rows = plan_rows(m, r.args->devices, r.as);
  const Row& tsp = t.rows[0];
  const Row& tp = t.rows[1];
  if (tsp.skipped.empty() && tp.skipped.empty()) {
    Ratio ratio{tsp.traffic.paper_forward / tp.traffic.paper_forward, std::nullopt};
    if (m.n_heads == m.n_kv_heads && m.ffn == 4 * m.hidden)
      ratio.paper = 0.5 + 4.0 * static_cast<double>(m.hidden) / static_cast<double>(m.B * S);
    t.ratio = ratio;
  }
  for (const Row& row : t.rows)
    if (row.skipped.empty())
      t.times.emplace_back(row.st, cost::step_time(m, row.st, r.dev, r.as, r.total));
  if (r.args->dry_run) t.dry = dry_run(m, r.args->devices);
  return t;
}

// The arguments checked and every table computed; nothing written yet.
PlanReport plan_report(const PlanArgs& a) {
  if (a.devices < 1 || a.devices > 4096)
    throw ConfigError("--devices " + std::to_string(a.devices) + ": must be 1 to 4096");
  if (a.batch < 1) throw ConfigError("--batch " + std::to_string(a.batch) + ": must be >= 1");
  PlanReport r;
  r.args = &a;
  r.capacity = parse_bytes("--device-mem", a.device_mem);
  const std::vector<std::int64_t> seqs =
      a.sweep.empty() ? std::vector<std::int64_t>{parse_count("--seq", a.seq)}
                      : parse_sweep(a.sweep);
  r.as = memory_assumptions(a.assumptions);
  r.dev = a.device == "h100" ? cost::DeviceModel::h100() : cost::DeviceModel::mi300x();
  if (a.mfu) {
    if (!(*a.mfu > 0 && *a.mfu <= 1))
      throw ConfigError("--mfu " + fmt("%g", *a.mfu) + ": must be in (0, 1]");
    r.dev.mfu = *a.mfu;
  }
  r.total = a.total_devices == 0 ? a.devices : a.total_devices;
  if (r.total < 1 || r.total > (1 << 20) || r.total % a.devices != 0)
    throw ConfigError("--total-devices " + std::to_string(a.total_devices) +
                      ": must be a positive multiple of --devices " + std::to_string(a.devices) +
                      " up to 2^20");
  r.unit = unit_bytes(a.assumptions.units);
  r.m = plan_shape(a, a.batch, *std::max_element(seqs.begin(), seqs.end()));
  for (std::int64_t S : seqs) r.tables.push_back(plan_table(r, r.m, S));
  return r;
}

// ---- Text
// ------------------------------------------------------------------------------------

void print_header(const PlanReport& r, std::ostream& out) {
  const PlanArgs& a = *r.args;
  const cost::ModelShape& m = r.m;
  char line[512];
  std::snprintf(line, sizeof line,
                "tspemu plan: %s (h=%lld, L=%lld, heads %lld/%lld kv, ffn "
                "%lld, vocab %lld, "
                "%.2fB params), %d devices of %.2f %s, B=%lld\n",
                a.preset.c_str(), static_cast<long long>(m.hidden),
                static_cast<long long>(m.layers), static_cast<long long>(m.n_heads),
                static_cast<long long>(m.n_kv_heads), static_cast<long long>(m.ffn),
                static_cast<long long>(m.vocab), static_cast<double>(m.total_params()) / 1e9,
                a.devices, r.capacity / r.unit, a.assumptions.units.c_str(),
                static_cast<long long>(m.B));
  out << line << "assumptions (--assume " << a.assumptions.assume << "):\n";
  for (const std::string& s : describe(r.as)) out << "  " << s << "\n";
  out << "communication: bytes per layer per device in the ring convention; "
         "backward under "
      << recompute_name(r.as.recompute) << " recompute\n";
}

void print_memory_table(const PlanReport& r, const PlanTable& t, std::ostream& out) {
  auto u = [&](double bytes) { return fmt("%.2f", bytes / r.unit); };
  out << fmt("\nS = %s (%lld tokens), %s per device:\n", seq_label(t.S).c_str(),
             static_cast<long long>(t.S), r.args->assumptions.units.c_str())
      << padded("strategy", 20)
      << fmt(" %8s %8s %8s %8s %8s %8s %8s %8s %8s %5s %10s %10s\n", "weights", "grads", "optim",
             "activ", "logits", "comm", "work", "overhd", "total", "fits", "fwd MB/L", "bwd MB/L");
  for (const Row& row : t.rows) {
    if (!row.skipped.empty()) {
      out << padded(row.st.name(), 20) << "  skipped: " << row.skipped << "\n";
      continue;
    }
    const auto& d = row.mem;
    out << padded(row.st.name(), 20)
        << fmt(" %8s %8s %8s %8s %8s %8s %8s %8s %8s %5s %10.1f %10.1f\n", u(d.weights).c_str(),
               u(d.gradients).c_str(), u(d.optimizer()).c_str(), u(d.activations).c_str(),
               u(d.logits).c_str(), u(d.comm).c_str(), u(d.workspace).c_str(),
               u(d.overhead).c_str(), u(d.total()).c_str(), d.total() <= r.capacity ? "yes" : "no",
               row.traffic.paper_forward / 1e6,
               row.traffic.paper_backward_under(r.as.recompute) / 1e6);
  }
  if (t.ratio) {
    out << fmt("TSP/TP forward volume per layer: %.4f", t.ratio->tsp_over_tp);
    if (t.ratio->paper)
      out << fmt(" (paper, g = 1, F = 4: 1/2 + 4h/(B·S) = %.4f)", *t.ratio->paper);
    else
      out << " (the paper's 1/2 + 4h/(B·S) assumes g = 1, F = 4)";
    out << "\n";
  }
}

void print_times(const PlanReport& r, const PlanTable& t, std::ostream& out) {
  out << fmt("time per step on %d %s (MFU %.2f; cost::step_time: compute, "
             "communication with "
             "each strategy's overlap, data-parallel gradient all-reduce):\n",
             r.total, r.dev.name.c_str(), r.dev.mfu)
      << padded("strategy", 20)
      << fmt(" %9s %10s %10s %10s %9s %14s %12s\n", "replicas", "compute s", "comm s", "exposed s",
             "step s", "tokens/s", "tok/s/GPU");
  for (const auto& [st, s] : t.times)
    out << padded(st.name(), 20)
        << fmt(" %9d %10.3f %10.3f %10.3f %9.3f %14.0f %12.0f\n", s.replicas, s.compute, s.comm,
               s.exposed_comm + s.data_parallel, s.step, s.tokens_per_s, s.tokens_per_s / r.total);
}

double gib(std::size_t b) {
  return static_cast<double>(b) / (1024.0 * 1024 * 1024);
}
double mib(std::uint64_t b) {
  return static_cast<double>(b) / (1024.0 * 1024);
}

void print_dry_row(const DryRow& d, std::ostream& out) {
  if (!d.skipped.empty()) {
    out << fmt("%s  skipped: %s\n", padded(d.st.name(), 20).c_str(), d.skipped.c_str());
    return;
  }
  out << fmt("%s %7.2f %8.2f", padded(d.st.name(), 20).c_str(), d.seconds, gib(d.peak));
  for (std::size_t c = 0; c < kCategoryCount; ++c) out << fmt(" %8.2f", gib(d.category_peak[c]));
  out << fmt(" %10.1f %10.1f %6s\n", mib(d.forward.total_received()),
             mib(d.backward.total_received()), d.match ? "equal" : "DIFFER");
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const auto& f = d.forward.by_kind[k];
    const auto& b = d.backward.by_kind[k];
    if (f.calls + b.calls == 0) continue;
    out << fmt(
        "    rank 0 %-15s fwd %4llu calls %10.2f MiB (model %10.2f)   "
        "bwd %4llu calls "
        "%10.2f MiB (model %10.2f)\n",
        collective_name(static_cast<CollectiveKind>(k)), static_cast<unsigned long long>(f.calls),
        mib(f.bytes_received), mib(d.model.forward.by_kind[k].bytes_received),
        static_cast<unsigned long long>(b.calls), mib(b.bytes_received),
        mib(d.model.backward.by_kind[k].bytes_received));
  }
}

void print_dry_run(const DryRun& run, std::ostream& out) {
  out << "\ndry run: one layer (forward + backward) of each strategy's blocks, "
         "fp32 buffers, "
         "accounting only;\npeak per rank by category (max over ranks, GiB), "
         "and bytes per "
         "collective on every rank vs the closed-form traffic "
         "(cost::layer_traffic):\n";
  out << fmt("%-20s %7s %8s", "strategy", "time s", "peak");
  // Category columns, in Category order, short enough for 8 characters.
  static_assert(kCategoryCount == 9);
  for (const char* c :
       {"weights", "grads", "optim", "activ", "kv", "comm", "work", "other", "kv_cache"})
    out << fmt(" %8s", c);
  out << fmt(" %10s %10s %6s\n", "fwd MiB/r0", "bwd MiB/r0", "model");
  for (const DryRow& d : run.rows) print_dry_row(d, out);
  out << fmt("process max RSS: %.1f MiB\n", run.max_rss_mib);
}

void print_report(const PlanReport& r, std::ostream& out) {
  print_header(r, out);
  for (const PlanTable& t : r.tables) {
    print_memory_table(r, t, out);
    print_times(r, t, out);
    if (t.dry) print_dry_run(*t.dry, out);
  }
}

// ---- JSON
// ------------------------------------------------------------------------------------

nlohmann::json row_json(const PlanReport& r, const Row& row) {
  nlohmann::json j = {{"strategy", row.st.name()}, {"ranks", row.st.ranks()}};
  if (!row.skipped.empty()) {
    j["skipped"] = row.skipped;
    return j;
  }
  const auto& d = row.mem;
  j.update({{"skipped", nullptr},
            {"params", d.params},
            {"memory_bytes",
             {{"weights", d.weights},
              {"gradients", d.gradients},
              {"master", d.master},
              {"moments", d.moments},
              {"optimizer", d.optimizer()},
              {"activations", d.activations},
              {"logits", d.logits},
              {"comm", d.comm},
              {"workspace", d.workspace},
              {"overhead", d.overhead},
              {"total", d.total()}}},
            {"fits", d.total() <= r.capacity},
            {"forward_bytes_per_layer", row.traffic.paper_forward},
            {"backward_bytes_per_layer", row.traffic.paper_backward_under(r.as.recompute)}});
  return j;
}

nlohmann::json dry_row_json(const DryRow& d) {
  nlohmann::json j = {{"strategy", d.st.name()}, {"ranks", d.st.ranks()}};
  if (!d.skipped.empty()) {
    j["skipped"] = d.skipped;
    return j;
  }
  nlohmann::json collectives = nlohmann::json::array();
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const auto& f = d.forward.by_kind[k];
    const auto& b = d.backward.by_kind[k];
    if (f.calls + b.calls == 0) continue;
    collectives.push_back(
        {{"collective", collective_name(static_cast<CollectiveKind>(k))},
         {"forward_calls", f.calls},
         {"forward_received_bytes", f.bytes_received},
         {"forward_sent_bytes", f.bytes_sent},
         {"forward_model_received_bytes", d.model.forward.by_kind[k].bytes_received},
         {"backward_calls", b.calls},
         {"backward_received_bytes", b.bytes_received},
         {"backward_sent_bytes", b.bytes_sent},
         {"backward_model_received_bytes", d.model.backward.by_kind[k].bytes_received}});
  }
  nlohmann::json cats;
  for (std::size_t c = 0; c < kCategoryCount; ++c)
    cats[category_name(static_cast<Category>(c))] = d.category_peak[c];
  j.update({{"skipped", nullptr},
            {"seconds", d.seconds},
            {"peak_bytes", d.peak},
            {"category_peak_bytes", cats},
            {"rank0_collectives", collectives},
            {"traffic_equals_closed_form", d.match}});
  return j;
}

nlohmann::json table_json(const PlanReport& r, const PlanTable& t) {
  nlohmann::json table = {{"S", t.S}, {"rows", nlohmann::json::array()}};
  for (const Row& row : t.rows) table["rows"].push_back(row_json(r, row));
  if (t.ratio) {
    table["tsp_over_tp_forward"] = t.ratio->tsp_over_tp;
    table["paper_ratio"] = t.ratio->paper ? nlohmann::json(*t.ratio->paper) : nullptr;
  }
  nlohmann::json times = nlohmann::json::array();
  for (const auto& [st, s] : t.times)
    times.push_back({{"strategy", st.name()},
                     {"replicas", s.replicas},
                     {"compute_s", s.compute},
                     {"comm_s", s.comm},
                     {"exposed_comm_s", s.exposed_comm},
                     {"data_parallel_s", s.data_parallel},
                     {"step_s", s.step},
                     {"tokens_per_s", s.tokens_per_s}});
  table["time"] = times;
  if (t.dry) {
    nlohmann::json rows = nlohmann::json::array();
    for (const DryRow& d : t.dry->rows) rows.push_back(dry_row_json(d));
    table["dry_run"] = rows;
  }
  return table;
}

nlohmann::json report_json(const PlanReport& r) {
  const PlanArgs& a = *r.args;
  const cost::ModelShape& m = r.m;
  nlohmann::json j = document("plan");
  j["config"] = plan_model_json(a, m);
  j["config"].update({{"devices", a.devices},
                      {"device_bytes", r.capacity},
                      {"batch", m.B},
                      {"recompute", recompute_name(r.as.recompute)},
                      {"assume", a.assumptions.assume},
                      {"assumptions", describe(r.as)},
                      {"units", a.assumptions.units}});
  j["tables"] = nlohmann::json::array();
  for (const PlanTable& t : r.tables) j["tables"].push_back(table_json(r, t));
  if (!a.sweep.empty()) j["svg"] = a.svg_path;
  return j;
}

// ---- SVG (--sweep)
// -----------------------------------------------------------------------------

void write_sweep_svg(const PlanReport& r) {
  const PlanArgs& a = *r.args;
  const std::string& uname = a.assumptions.units;
  Panel mem{"memory per device", "sequence length S", uname + " per device", true, {}, {}, {}, {}};
  Panel comm{"communication per layer per device (forward)",
             "sequence length S",
             "MB per layer per device",
             true,
             {},
             {},
             {},
             {}};
  for (std::size_t i = 0; i < r.tables[0].rows.size(); ++i) {
    const std::string name = r.tables[0].rows[i].st.name();
    Series sm{name, {}, false}, sc{name, {}, false};
    for (const PlanTable& t : r.tables) {
      const Row& row = t.rows[i];
      if (!row.skipped.empty()) continue;
      sm.points.emplace_back(static_cast<double>(t.S), row.mem.total() / r.unit);
      sc.points.emplace_back(static_cast<double>(t.S), row.traffic.paper_forward / 1e6);
    }
    if (sm.points.empty()) continue;
    mem.series.push_back(sm);
    comm.series.push_back(sc);
  }
  for (const PlanTable& t : r.tables) {
    mem.x_ticks.emplace_back(static_cast<double>(t.S), seq_label(t.S));
    comm.x_ticks.emplace_back(static_cast<double>(t.S), seq_label(t.S));
  }
  mem.hlines.emplace_back(r.capacity / r.unit,
                          "device " + fmt("%.2f", r.capacity / r.unit) + " " + uname);
  write_svg(a.svg_path, "tspemu plan: " + a.preset + ", " + std::to_string(a.devices) + " devices",
            {mem, comm});
}

}  // namespace

nlohmann::json plan_model_json(const PlanArgs& a, const cost::ModelShape& m) {
  return {{"preset", a.preset}, {"hidden", m.hidden},       {"layers", m.layers},
          {"heads", m.n_heads}, {"kv_heads", m.n_kv_heads}, {"ffn", m.ffn},
          {"vocab", m.vocab}};
}

std::vector<std::string> plan_presets() {
  std::vector<std::string> v;
  for (const Preset& p : kPresets) v.emplace_back(p.name);
  return v;
}

cost::ModelShape preset_shape(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) {
      cost::ModelShape m;
      m.hidden = p.hidden;
      m.layers = p.layers;
      m.n_heads = p.heads;
      m.n_kv_heads = p.kv_heads;
      m.ffn = p.ffn;
      m.vocab = p.vocab;
      return m;
    }
  throw ConfigError("preset " + name +
                    ": unknown (paper-7b, llama2-7b, llama3-8b, llama2-13b, "
                    "llama3-70b)");
}

std::vector<std::int64_t> parse_sweep(const std::string& text) {
  const std::string flag = "--sweep";
  if (text.rfind("seq=", 0) != 0)
    throw ConfigError(flag + " " + text +
                      ": expected seq=FROM..TO, seq=FROM..TO:STEPS or seq=A,B,C");
  const std::string body = text.substr(4);
  std::vector<std::int64_t> v;
  if (const auto dots = body.find(".."); dots != std::string::npos) {
    std::string to = body.substr(dots + 2);
    std::int64_t steps = 0;
    if (const auto colon = to.find(':'); colon != std::string::npos) {
      steps = parse_count(flag, to.substr(colon + 1));
      if (steps > kMaxSweepPoints)
        throw ConfigError(flag + " " + text + ": at most " + std::to_string(kMaxSweepPoints) +
                          " points, not " + std::to_string(steps));
      to = to.substr(0, colon);
    }
    const std::int64_t a = parse_count(flag, body.substr(0, dots)), b = parse_count(flag, to);
    if (b < a) throw ConfigError(flag + " " + text + ": TO must not be below FROM");
    if (steps == 0) {
      for (std::int64_t s = a;; s *= 2) {  // at most 41 points: 1 <= a <= b <= 2^40
        v.push_back(s);
        if (s > b / 2) break;
      }
    } else if (steps == 1) {
      v.push_back(a);
    } else {  // evenly spaced, rounded to multiples of 1024 when both ends are
      const std::int64_t q = (a % 1024 == 0 && b % 1024 == 0) ? 1024 : 1;
      for (std::int64_t i = 0; i < steps; ++i) v.push_back((a + (b - a) * i / (steps - 1)) / q * q);
    }
  } else {
    std::size_t start = 0;
    while (start <= body.size()) {
      const auto comma = body.find(',', start);
      v.push_back(parse_count(flag, body.substr(start, comma - start)));
      if (comma == std::string::npos) break;
      if (v.size() == static_cast<std::size_t>(kMaxSweepPoints))
        throw ConfigError(flag + ": at most " + std::to_string(kMaxSweepPoints) + " points");
      start = comma + 1;
    }
  }
  return v;
}

cost::ModelShape plan_shape(const PlanArgs& a, std::int64_t B, std::int64_t S) {
  cost::ModelShape m = preset_shape(a.preset);
  auto override_with = [](std::int64_t& field, const std::optional<std::int64_t>& v,
                          const char* flag) {
    if (!v) return;
    if (*v < 1) throw ConfigError(std::string(flag) + " " + std::to_string(*v) + ": must be >= 1");
    if (*v > kMaxCount)
      throw ConfigError(std::string(flag) + " " + std::to_string(*v) + ": must be at most " +
                        std::to_string(kMaxCount));
    field = *v;
  };
  override_with(m.layers, a.layers, "--layers");
  override_with(m.hidden, a.hidden, "--hidden");
  override_with(m.n_heads, a.heads, "--heads");
  override_with(m.n_kv_heads, a.kv_heads, "--kv-heads");
  override_with(m.ffn, a.ffn, "--ffn");
  override_with(m.vocab, a.vocab, "--vocab");
  if (B < 1) throw ConfigError("--batch " + std::to_string(B) + ": must be >= 1");
  if (m.hidden % m.n_heads != 0)
    throw ConfigError("--heads " + std::to_string(m.n_heads) + ": must divide --hidden " +
                      std::to_string(m.hidden));
  if (m.n_heads % m.n_kv_heads != 0)
    throw ConfigError("--kv-heads " + std::to_string(m.n_kv_heads) + ": must divide --heads " +
                      std::to_string(m.n_heads));
  // The cost model forms B·S·width element counts (width up to 2h + 2·ffn, the
  // vocabulary) and L·(layer parameters) in int64; a factor 16 leaves room for
  // the byte counts of 8-byte elements and the sums of a few such terms.
  auto product = [&](std::initializer_list<std::pair<std::int64_t, const char*>> factors) {
    std::int64_t p = 16;
    std::string named;
    for (const auto& [v, flag] : factors) {
      named += std::string(named.empty() ? "" : " x ") + flag + " " + std::to_string(v);
      if (__builtin_mul_overflow(p, v, &p))
        throw ConfigError(named + ": the product overflows 64-bit counts (16·" + named +
                          " > 2^63); use smaller values");
    }
    return p;
  };
  const std::int64_t width = std::max({2 * m.hidden + 2 * m.ffn, m.vocab, m.hidden});
  product({{B, "--batch"}, {S, "--seq"}, {width, "max(2·(--hidden + --ffn), --vocab)"}});
  product({{m.layers, "--layers"}, {m.hidden, "--hidden"}, {width, "2·(--hidden + --ffn)"}});
  product({{m.hidden, "--hidden"}, {m.vocab, "--vocab"}});
  m.B = B;
  m.S = S;
  return m;
}

CLI::App* add_plan_command(CLI::App& app, PlanArgs& a) {
  auto* cmd = app.add_subcommand("plan",
                                 "analytic memory and communication per device "
                                 "at real sizes (no ranks run): which "
                                 "strategies fit, bytes per layer, the TSP/TP "
                                 "ratio; --sweep draws an SVG");
  cmd->add_option("preset,--preset", a.preset,
                  "model: paper-7b, llama2-7b, llama3-8b, llama2-13b or llama3-70b")
      ->capture_default_str();
  cmd->add_option("--layers,-L", a.layers, "override the preset's layers");
  cmd->add_option("--hidden", a.hidden, "override the preset's hidden size");
  cmd->add_option("--heads", a.heads, "override the preset's query heads");
  cmd->add_option("--kv-heads", a.kv_heads, "override the preset's key/value heads");
  cmd->add_option("--ffn", a.ffn, "override the preset's gated-MLP width");
  cmd->add_option("--vocab", a.vocab, "override the preset's vocabulary");
  cmd->add_option("--devices,-N", a.devices, "devices N (TSP D = N, TP T = N, ...)")
      ->capture_default_str();
  cmd->add_option("--device-mem", a.device_mem, "memory per device, e.g. 80GB, 192GB, 96GiB")
      ->capture_default_str();
  cmd->add_option("--seq,-S", a.seq, "sequence length, K = 1024 (e.g. 128K)")
      ->capture_default_str();
  cmd->add_option("--batch,-B", a.batch, "micro-batch B")->capture_default_str();
  cmd->add_option("--sweep", a.sweep,
                  "seq=16K..128K (doubling), seq=16K..128K:8 (8 even steps) or "
                  "seq=16K,24K: a table "
                  "per length and an SVG chart");
  cmd->add_option("--svg", a.svg_path, "the --sweep chart's file")->capture_default_str();
  add_assumption_options(*cmd, a.assumptions);
  cmd->add_option("--device", a.device,
                  "time model's device: mi300x (1307 TFLOP/s, 448 GB/s in a "
                  "node) or h100 (989 "
                  "TFLOP/s, 450 GB/s); 50 GB/s between nodes")
      ->capture_default_str()
      ->check(CLI::IsMember({"mi300x", "h100"}));
  cmd->add_option("--mfu", a.mfu, "fraction of peak FLOP/s the kernels reach (default 0.4)");
  cmd->add_option("--total-devices", a.total_devices,
                  "GPUs in all, data-parallel replicas of each strategy "
                  "(default: --devices)");
  cmd->add_option("--json", a.json_path, "also write the tables as JSON to this file");
  cmd->add_flag("--dry-run", a.dry_run,
                "also run one layer of every strategy's real blocks dry at "
                "this size (fp32 "
                "buffers, accounting only): per-rank peak memory by category "
                "and bytes per "
                "collective vs the closed forms");
  cmd->add_flag("--inference", a.inference,
                "report the inference schedules instead (TP, SP, TP+SP, Helix, TSP-M, TSP-W): "
                "weights and KV cache per rank, max context, bytes per decode step per "
                "collective, for --batch sequences of --seq cached tokens");
  cmd->add_option("--element-bytes", a.element_bytes,
                  "with --inference: bytes per weight, activation and KV element (1, 2 or 4)")
      ->capture_default_str();
  cmd->add_option("--pp", a.pp,
                  "report a pipeline schedule over this many ranks instead: its bubble from the "
                  "simulated clock and the activations each rank keeps (plan_pipeline.hpp)");
  cmd->add_option("--microbatches", a.microbatches,
                  "with --pp: microbatches per step, dividing --batch (default: --batch)");
  cmd->add_option("--schedule", a.schedule, "with --pp: gpipe, 1f1b, interleaved-1f1b or zb-h1")
      ->capture_default_str();
  cmd->add_option("--virtual-stages", a.virtual_stages,
                  "with --pp: stages per rank (interleaved-1f1b; default 2 there, else 1)");
  return cmd;
}

int plan_command(const PlanArgs& a, std::ostream& out) {
  if (a.pp) return plan_pipeline_command(a, out);
  if (a.inference) return plan_inference_command(a, out);
  check_output_files({{"--json", a.json_path}, {"--svg", a.svg_path}});
  const PlanReport r = plan_report(a);
  print_report(r, out);
  if (!a.sweep.empty()) {
    write_sweep_svg(r);
    out << "\nwrote " << a.svg_path << "\n";
  }
  if (!a.json_path.empty()) write_json(a.json_path, report_json(r));
  return 0;
}

}  // namespace tspemu::app
