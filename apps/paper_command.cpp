#include "paper_command.hpp"

#include <CLI/CLI.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "output_files.hpp"
#include "plan_command.hpp"
#include "problem_options.hpp"
#include "stack_report.hpp"
#include "svg_chart.hpp"
#include "tspemu/plan/strategy_table.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

namespace {

constexpr int kDevices = 8;             // one 8 × MI300X node (TSP-NOTES.md)
constexpr double kDeviceBytes = 192e9;  // MI300X: 192 GB HBM3
constexpr std::int64_t kK = 1024;

// The published 8-GPU memory points: 16K and 128K tokens, B = 1 (TSP-NOTES.md, the authors' post).
struct MemoryPoint {
  const char* strategy_label;  // as the paper names it
  cost::Strategy st;           // what tspemu compares it with
  std::int64_t S;
  double gb;
  const char* note;
};
const MemoryPoint kMemoryPoints[] = {
    {"TSP", cost::Strategy::tsp(8), 16 * kK, 31.0, ""},
    {"TP", cost::Strategy::tp(8), 16 * kK, 31.5, ""},
    {"TSP", cost::Strategy::tsp(8), 128 * kK, 38.8, ""},
    {"TP", cost::Strategy::tp(8), 128 * kK, 70.0, ""},
    {"TP+SP", cost::Strategy::tp_sp(2, 4), 128 * kK, 85.0,
     "factorization not published; compared with T=2×Σ=4"},
    {"TP+SP", cost::Strategy::sp(8), 128 * kK, 140.0,
     "factorization not published; compared with T=1×Σ=8 (= SP), the only one whose model states "
     "come near 140 GB"},
};
constexpr double kTspTokensPerS = 173e6, kTpSpTokensPerS = 86e6;  // 1024 GPUs, D = 8, 128K
constexpr int kGpus = 1024;
constexpr const char* kTimeNote =
    "time model (cost_model.hpp): MI300X 1307 TFLOP/s at MFU 0.4 (assumed), 448 GB/s in a node, "
    "50 GB/s between nodes";

double total_gb(const cost::Strategy& st, std::int64_t S, const cost::MemoryAssumptions& a) {
  return cost::device_memory(cost::paper_7b(1, S), st, a).total() / 1e9;
}

// The smallest B·S (B = 1) at which TSP's forward volume per layer is at most TP's, D = T = 8.
std::int64_t tsp_tp_crossing() {
  auto tsp_le_tp = [](std::int64_t S) {
    const cost::ModelShape m = cost::paper_7b(1, S);
    return cost::paper_forward_elements(m, cost::Strategy::tsp(kDevices)) <=
           cost::paper_forward_elements(m, cost::Strategy::tp(kDevices));
  };
  std::int64_t lo = 1, hi = std::int64_t{1} << 30;  // tsp > tp at lo, <= at hi
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (tsp_le_tp(mid) ? hi : lo) = mid;
  }
  return hi;
}

std::string seq_label(std::int64_t S) {
  return S % kK == 0 ? std::to_string(S / kK) + "K" : std::to_string(S);
}

std::vector<cost::Strategy> estimated_strategies() {
  std::vector<cost::Strategy> v;
  for (const cost::Strategy& st : tsp::strategies_at(kDevices))
    if (tsp::strategy_info(st.scheme).device_estimate) v.push_back(st);
  return v;
}

Panel line_panel(std::string title, std::string x, std::string y, bool log2_x) {
  Panel p;
  p.title = std::move(title);
  p.x_label = std::move(x);
  p.y_label = std::move(y);
  p.log2_x = log2_x;
  return p;
}

std::vector<std::int64_t> lengths() {
  return parse_sweep("seq=16K..128K:8");
}

std::vector<std::pair<double, std::string>> seq_ticks(const std::vector<std::int64_t>& seqs) {
  std::vector<std::pair<double, std::string>> t;
  t.reserve(seqs.size());
  for (std::int64_t S : seqs) t.emplace_back(static_cast<double>(S), seq_label(S));
  return t;
}

// Figure 1: per-category memory per strategy at 128K.
Panel figure1_panel(const cost::MemoryAssumptions& a, const std::string& name) {
  Panel p = line_panel("128K tokens, " + name, "", "GB per device", false);
  p.bars.stacks = {"weights", "gradients", "master + moments", "activations",
                   "logits",  "comm",      "workspace",        "overhead"};
  p.bars.values.assign(p.bars.stacks.size(), {});
  for (const cost::Strategy& st : estimated_strategies()) {
    const cost::DeviceMemory d = cost::device_memory(cost::paper_7b(1, 128 * kK), st, a);
    p.bars.groups.push_back(st.name());
    const double parts[] = {d.weights, d.gradients, d.optimizer(), d.activations,
                            d.logits,  d.comm,      d.workspace,   d.overhead};
    for (std::size_t i = 0; i < std::size(parts); ++i) p.bars.values[i].push_back(parts[i] / 1e9);
  }
  p.hlines.emplace_back(kDeviceBytes / 1e9, "MI300X 192 GB");
  return p;
}

// Memory per device vs S for every strategy, with the published points when asked.
Panel memory_vs_s(const cost::MemoryAssumptions& a, const std::string& name, bool published) {
  const std::vector<std::int64_t> seqs = lengths();
  Panel p = line_panel("peak memory per device, " + name, "sequence length S (B = 1)",
                       "GB per device", true);
  for (const cost::Strategy& st : estimated_strategies()) {
    Series s{st.name(), {}, false};
    for (std::int64_t S : seqs) s.points.emplace_back(static_cast<double>(S), total_gb(st, S, a));
    p.series.push_back(s);
  }
  if (published) {
    for (const char* who : {"TSP", "TP", "TP+SP"}) {
      Series s{std::string("published ") + who, {}, true};
      for (const MemoryPoint& m : kMemoryPoints)
        if (std::string(m.strategy_label) == who)
          s.points.emplace_back(static_cast<double>(m.S), m.gb);
      p.series.push_back(s);
    }
  }
  p.x_ticks = seq_ticks(seqs);
  p.hlines.emplace_back(kDeviceBytes / 1e9, "MI300X 192 GB");
  return p;
}

// Forward bytes per layer per device (bf16) of every strategy against x, for shapes from make.
template <class MakeShape>
Panel volume_panel(const std::string& title, const std::string& x_label, bool log2_x,
                   const std::vector<double>& xs, MakeShape make) {
  Panel p = line_panel(title, x_label, "forward MB per layer per device (bf16)", log2_x);
  for (const cost::Strategy& st : estimated_strategies()) {
    Series s{st.name(), {}, false};
    for (double x : xs)
      s.points.emplace_back(x, cost::paper_forward_elements(make(x), st) * 2 / 1e6);
    p.series.push_back(s);
  }
  return p;
}

// Figure 6's family: g = 1, F = 4, head size 128, L = h / 128, vocabulary 32000; h from 2048.
cost::ModelShape family(std::int64_t h, std::int64_t S) {
  cost::ModelShape m = cost::paper_7b(1, S);
  m.hidden = h;
  m.n_heads = m.n_kv_heads = h / 128;
  m.ffn = 4 * h;
  m.layers = h / 128;
  return m;
}
constexpr std::int64_t kFamily[] = {2048, 3072, 4096, 5120, 6144, 7168, 8192};

std::string svg_body(const std::string& svg) {  // without the XML prolog, for inlining
  const auto at = svg.find("<svg");
  return at == std::string::npos ? svg : svg.substr(at);
}

std::string html_escape(const std::string& s) {
  std::string r;
  for (char c : s)
    r += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return r;
}

std::string number(double v, const char* f = "%.2f") {
  return std::isnan(v) ? "—" : fmt(f, v);
}

}  // namespace

std::vector<PaperComparison> paper_comparisons(const cost::MemoryAssumptions& chosen) {
  const cost::MemoryAssumptions meg = assumption_bundle("megatron-mi300x");
  std::vector<PaperComparison> rows;
  for (const MemoryPoint& m : kMemoryPoints)
    rows.push_back({fmt("peak memory per GPU, %s, %s tokens (tspemu: %s)", m.strategy_label,
                        seq_label(m.S).c_str(), m.st.name().c_str()),
                    "GB", "authors' post, 8 × MI300X, 7B-class model, B = 1", m.gb,
                    total_gb(m.st, m.S, chosen), total_gb(m.st, m.S, meg), m.note});
  const double h = 4096;
  rows.push_back({"B·S at which TSP's forward volume equals TP's (D = T = 8)", "tokens",
                  "paper: TSP/TP = 1/2 + 4h/(B·S), below 1 for B·S > 8h", 8 * h,
                  static_cast<double>(tsp_tp_crossing()), static_cast<double>(tsp_tp_crossing()),
                  "tspemu: bisection on the cost model's forward volumes"});
  const cost::ModelShape m128 = cost::paper_7b(1, 128 * kK);
  const double ratio = cost::paper_forward_elements(m128, cost::Strategy::tsp(kDevices)) /
                       cost::paper_forward_elements(m128, cost::Strategy::tp(kDevices));
  rows.push_back({"TSP/TP forward volume per layer, 128K tokens", "", "paper: 1/2 + 4h/(B·S)",
                  0.5 + 4 * h / (128.0 * kK), ratio, ratio, ""});
  auto tps = [&](const cost::Strategy& st, const cost::MemoryAssumptions& as) {
    return cost::step_time(m128, st, cost::DeviceModel::mi300x(), as, kGpus).tokens_per_s / 1e6;
  };
  cost::DeviceModel peak = cost::DeviceModel::mi300x();
  peak.mfu = 1;
  const double bound =
      cost::step_time(m128, cost::Strategy::tsp(8), peak, chosen, kGpus).tokens_per_s / 1e6;
  rows.push_back({"throughput, TSP D=8, 128K, 1024 GPUs", "M tokens/s", "authors' post (Fig. 10)",
                  kTspTokensPerS / 1e6, tps(cost::Strategy::tsp(8), chosen),
                  tps(cost::Strategy::tsp(8), meg),
                  std::string(kTimeNote) +
                      fmt("; even at MFU 1 the model gives %.1f M tokens/s, so the published "
                          "figure must count tokens differently: compare the ratio",
                          bound)});
  const cost::Strategy matched = cost::Strategy::tp_sp(8, 8);
  rows.push_back({"throughput, matched TP+SP, 128K, 1024 GPUs (tspemu: " + matched.name() + ")",
                  "M tokens/s", "authors' post (Fig. 10)", kTpSpTokensPerS / 1e6,
                  tps(matched, chosen), tps(matched, meg),
                  "matched = T=8 in a node × Σ=8 across nodes (not published)"});
  rows.push_back({"throughput ratio TSP / matched TP+SP, 128K", "", "authors' post (Fig. 10)",
                  kTspTokensPerS / kTpSpTokensPerS,
                  tps(cost::Strategy::tsp(8), chosen) / tps(matched, chosen),
                  tps(cost::Strategy::tsp(8), meg) / tps(matched, meg), ""});
  return rows;
}

namespace {

// A figure: its file, title, caption and computed panels.
struct Figure {
  std::string file, title, caption;
  std::vector<Panel> panels;
};

// Everything `paper` reports: computed first, then rendered as text, JSON, SVG and HTML.
struct PaperReport {
  const PaperArgs* args = nullptr;
  std::string cname;  // "--assume NAME", the chosen set's label
  cost::MemoryAssumptions chosen, meg;
  std::vector<Figure> figures;
  std::vector<PaperComparison> rows;
  std::string order_chosen, order_meg;  // the 128K ordering under each set
};

Figure figure5(const PaperReport& r) {
  const std::vector<std::int64_t> seqs = lengths();
  std::vector<double> xs;
  xs.reserve(seqs.size());
  for (std::int64_t S : seqs) xs.push_back(static_cast<double>(S));
  Panel vol = volume_panel("forward communication vs S", "sequence length S (B = 1)", true, xs,
                           [](double S) { return cost::paper_7b(1, std::llround(S)); });
  vol.x_ticks = seq_ticks(seqs);
  return {"figure5.svg",
          "Figure 5: communication volume and memory vs sequence length",
          "Forward bytes per layer per device (ring convention) and peak memory per "
          "device, 7B-class model on 8 devices.",
          {vol, memory_vs_s(r.chosen, r.cname, false)}};
}

Figure figure6(const PaperReport& r) {
  std::vector<double> xs;
  for (std::int64_t h : kFamily)
    xs.push_back(static_cast<double>(family(h, 1).total_params()) / 1e9);
  auto shape_at = [&](double params_b) {
    for (std::int64_t h : kFamily)
      if (static_cast<double>(family(h, 1).total_params()) / 1e9 == params_b)
        return family(h, 128 * kK);
    throw std::logic_error("figure 6: no family member with that size");
  };
  Panel vol = volume_panel("forward communication vs parameters, 128K", "parameters (billions)",
                           false, xs, shape_at);
  std::vector<std::pair<double, std::string>> ticks;
  for (std::size_t i = 0; i < xs.size(); i += 2) ticks.emplace_back(xs[i], fmt("%.1f", xs[i]));
  vol.x_ticks = ticks;
  Panel mem = line_panel("peak memory vs parameters, 128K, " + r.cname, "parameters (billions)",
                         "GB per device", false);
  for (const cost::Strategy& st : estimated_strategies()) {
    Series s{st.name(), {}, false};
    for (double x : xs)
      s.points.emplace_back(x, cost::device_memory(shape_at(x), st, r.chosen).total() / 1e9);
    mem.series.push_back(s);
  }
  mem.hlines.emplace_back(kDeviceBytes / 1e9, "MI300X 192 GB");
  mem.x_ticks = ticks;
  return {"figure6.svg",
          "Figure 6: volume and memory vs parameter count",
          "A fixed-g, fixed-F family: g = 1, F = 4 (gated), head size 128, L = h/128, "
          "V = 32000, h = 2048 ... 8192; S = 128K, B = 1, 8 devices.",
          {vol, mem}};
}

Figure figure7() {
  Panel p =
      line_panel("TSP / TP forward volume per layer (D = T = 8)", "B·S tokens", "ratio", true);
  Series model{"tspemu cost model", {}, false}, paper{"paper: 1/2 + 4h/(B·S)", {}, true};
  for (std::int64_t bs = 4 * kK; bs <= 1024 * kK; bs *= 2) {
    const cost::ModelShape m = cost::paper_7b(1, bs);
    model.points.emplace_back(static_cast<double>(bs),
                              cost::paper_forward_elements(m, cost::Strategy::tsp(kDevices)) /
                                  cost::paper_forward_elements(m, cost::Strategy::tp(kDevices)));
    paper.points.emplace_back(static_cast<double>(bs), 0.5 + 4.0 * 4096 / static_cast<double>(bs));
    p.x_ticks.emplace_back(static_cast<double>(bs), bs == 32 * kK ? "8h=32K" : seq_label(bs));
  }
  p.series = {model, paper};
  p.hlines.emplace_back(1.0, "TSP = TP");
  return {"figure7.svg",
          "Figure 7: TSP/TP communication ratio vs B·S",
          fmt("The cost model's ratio and the paper's formula coincide; they cross 1 "
              "at B·S = %lld = 8h.",
              static_cast<long long>(tsp_tp_crossing())),
          {p}};
}

Figure figure10(const PaperReport& r) {
  const std::vector<std::int64_t> seqs = lengths();
  Panel p = line_panel("throughput on 1024 MI300X, " + r.cname, "sequence length S (B = 1)",
                       "M tokens/s (all GPUs)", true);
  const std::vector<cost::Strategy> shown = {
      cost::Strategy::tsp(8), cost::Strategy::tp(8), cost::Strategy::tp_sp(2, 4),
      cost::Strategy::tp_sp(4, 2), cost::Strategy::tp_sp(8, 8)};
  for (const cost::Strategy& st : shown) {
    Series s{st.name(), {}, false};
    for (std::int64_t S : seqs)
      s.points.emplace_back(
          static_cast<double>(S),
          cost::step_time(cost::paper_7b(1, S), st, cost::DeviceModel::mi300x(), r.chosen, kGpus)
                  .tokens_per_s /
              1e6);
    p.series.push_back(s);
  }
  p.series.push_back(Series{"published TSP D=8", {{128.0 * kK, kTspTokensPerS / 1e6}}, true});
  p.series.push_back(
      Series{"published matched TP+SP", {{128.0 * kK, kTpSpTokensPerS / 1e6}}, true});
  p.x_ticks = seq_ticks(seqs);
  return {"figure10.svg",
          "Figure 10: throughput vs sequence length",
          std::string("Lines: tspemu's time model (") + kTimeNote +
              "); diamonds: the published 128K point.",
          {p}};
}

// The 128K ordering of the modelled strategies' memory under one assumption set.
std::string ordering(const cost::MemoryAssumptions& as) {
  std::vector<std::pair<double, std::string>> v;
  for (const cost::Strategy& st : estimated_strategies())
    v.emplace_back(total_gb(st, 128 * kK, as), st.name());
  std::sort(v.begin(), v.end());
  std::string s;
  for (const auto& [g, n] : v) s += (s.empty() ? "" : " < ") + n + fmt(" (%.1f)", g);
  return s;
}

PaperReport paper_report(const PaperArgs& a) {
  PaperReport r;
  r.args = &a;
  r.chosen = memory_assumptions(a.assumptions);
  r.meg = assumption_bundle("megatron-mi300x");
  r.cname = "--assume " + a.assumptions.assume;
  r.figures.push_back(
      {"figure1.svg",
       "Figure 1: memory per device by category (7B-class, 8 GPUs)",
       "Stacked per-category peak memory per device at 128K tokens, under the chosen "
       "assumptions (left) and megatron-mi300x (right).",
       {figure1_panel(r.chosen, r.cname), figure1_panel(r.meg, "megatron-mi300x")}});
  r.figures.push_back(figure5(r));
  r.figures.push_back(figure6(r));
  r.figures.push_back(figure7());
  r.figures.push_back(
      {"figure9.svg",
       "Figure 9: peak memory vs sequence length on MI300X",
       "Lines: tspemu; diamonds: the published measurements (8 × MI300X).",
       {memory_vs_s(r.chosen, r.cname, true), memory_vs_s(r.meg, "megatron-mi300x", true)}});
  r.figures.push_back(figure10(r));
  r.rows = paper_comparisons(r.chosen);
  r.order_chosen = ordering(r.chosen);
  r.order_meg = ordering(r.meg);
  return r;
}

double ratio_of(double v, double published) {
  return v / published;
}

void print_report(const PaperReport& r, std::ostream& out) {
  out << "tspemu paper: the 7B-class model (h 4096, L 32, 32 heads, F = 4 gated, V 32000), "
         "B = 1, 8 devices\n\n";
  out << fmt("%-70s %10s %10s %7s %10s %7s\n", "quantity", "published", "tspemu", "ratio",
             "megatron", "ratio");
  for (const PaperComparison& c : r.rows)
    out << padded(c.quantity, 70)
        << fmt(" %10s %10s %7s %10s %7s\n", number(c.published).c_str(), number(c.tspemu).c_str(),
               number(ratio_of(c.tspemu, c.published), "%.3f").c_str(),
               number(c.tspemu_megatron).c_str(),
               number(ratio_of(c.tspemu_megatron, c.published), "%.3f").c_str());
  out << "\n128K ordering, GB per device (" << r.cname << "): " << r.order_chosen << "\n";
  out << "128K ordering, GB per device (--assume megatron-mi300x): " << r.order_meg << "\n";
  out << "published 128K ordering: TSP (38.8) < TP (70.0) < TP+SP (85.0, 140.0)\n";
}

nlohmann::json report_json(const PaperReport& r) {
  const PaperArgs& a = *r.args;
  nlohmann::json j = document("paper");
  j["config"] = {{"model", "paper-7b"},
                 {"batch", 1},
                 {"devices", kDevices},
                 {"device_bytes", kDeviceBytes},
                 {"assume", a.assumptions.assume},
                 {"out", a.out_dir}};
  j["assumptions"] = {{"chosen", {{"name", a.assumptions.assume}, {"lines", describe(r.chosen)}}},
                      {"megatron-mi300x", describe(r.meg)}};
  j["rows"] = nlohmann::json::array();
  auto js = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  for (const PaperComparison& c : r.rows)
    j["rows"].push_back({{"quantity", c.quantity},
                         {"unit", c.unit},
                         {"source", c.source},
                         {"note", c.note},
                         {"published", c.published},
                         {"tspemu", js(c.tspemu)},
                         {"ratio", js(ratio_of(c.tspemu, c.published))},
                         {"tspemu_megatron", js(c.tspemu_megatron)},
                         {"ratio_megatron", js(ratio_of(c.tspemu_megatron, c.published))}});
  j["ordering_128k"] = {{"chosen", r.order_chosen}, {"megatron-mi300x", r.order_meg}};
  return j;
}

std::string table_html(const PaperReport& r) {
  std::ostringstream table;
  table << "<table><tr><th>quantity</th><th>unit</th><th>published</th><th>tspemu (" << r.cname
        << ")</th><th>ratio</th><th>tspemu (megatron-mi300x)</th><th>ratio</th><th>source, "
           "note</th></tr>\n";
  for (const PaperComparison& c : r.rows)
    table << "<tr><td>" << html_escape(c.quantity) << "</td><td>" << c.unit << "</td><td>"
          << number(c.published) << "</td><td>" << number(c.tspemu) << "</td><td>"
          << number(ratio_of(c.tspemu, c.published), "%.3f") << "</td><td>"
          << number(c.tspemu_megatron) << "</td><td>"
          << number(ratio_of(c.tspemu_megatron, c.published), "%.3f") << "</td><td>"
          << html_escape(c.source) << (c.note.empty() ? "" : "; " + html_escape(c.note))
          << "</td></tr>\n";
  table << "</table>\n";
  return table.str();
}

// Counts the figures whose SVG laid out with a non-empty box and drew at least one mark
// (a line, bar or marker with a non-empty bounding box).
constexpr const char* kRenderCheck =
    "<script>\n(function(){var figs=document.querySelectorAll('figure.paper-figure');"
    "var ok=0;figs.forEach(function(f){var s=f.querySelector('svg');if(!s)return;"
    "var r=s.getBoundingClientRect();var marks=0;"
    "s.querySelectorAll('polyline,path,rect,circle').forEach(function(e){var b=e.getBBox();"
    "if(b.width>0||b.height>0)marks++;});if(r.width>0&&r.height>0&&marks>1){ok++;"
    "f.setAttribute('data-rendered','yes');}});document.getElementById('render-check')"
    ".textContent='figures rendered: '+ok+' of '+figs.length;})();\n</script>\n";

// The page: the table, the orderings, both assumption sets and the figures inline (svgs[i] is
// figure i's SVG document).
std::string report_html(const PaperReport& r, const std::vector<std::string>& svgs) {
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>tspemu vs the "
          "TSP paper</title>\n<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
          "table{border-collapse:collapse}td,th{border:1px solid #999;padding:3px 6px;"
          "font-size:13px}figure{margin:20px 0}</style></head><body>\n"
          "<h1>tspemu against the TSP paper</h1>\n<p>Folding Tensor and Sequence Parallelism "
          "(arXiv 2604.26294); 7B-class model: h 4096, L 32, 32 heads, F = 4 gated, V 32000; "
          "B = 1; one node of 8 × MI300X (192 GB). Estimates of an analytic model, beside the "
          "published measurements; nothing fitted.</p>\n<p id=\"render-check\">figures rendered: "
          "not checked (needs JavaScript)</p>\n<h2>Published / tspemu / ratio</h2>\n"
       << table_html(r) << "<p>128K ordering (" << r.cname << "): " << html_escape(r.order_chosen)
       << "<br>128K ordering (megatron-mi300x): " << html_escape(r.order_meg)
       << "<br>published: TSP (38.8) &lt; TP (70.0) &lt; TP+SP (85.0, 140.0)</p>\n"
       << "<h2>Assumptions</h2>\n<h3>" << r.cname << "</h3><ul>\n";
  for (const std::string& s : describe(r.chosen)) html << "<li>" << html_escape(s) << "</li>\n";
  html << "</ul><h3>--assume megatron-mi300x</h3><ul>\n";
  for (const std::string& s : describe(r.meg)) html << "<li>" << html_escape(s) << "</li>\n";
  html << "</ul>\n<h2>Figures</h2>\n";
  for (std::size_t i = 0; i < r.figures.size(); ++i)
    html << "<figure class=\"paper-figure\" id=\"" << r.figures[i].file << "\">"
         << svg_body(svgs[i]) << "<figcaption>" << html_escape(r.figures[i].title) << ". "
         << html_escape(r.figures[i].caption) << "</figcaption></figure>\n";
  html << kRenderCheck << "</body></html>\n";
  return html.str();
}

}  // namespace

CLI::App* add_paper_command(CLI::App& app, PaperArgs& a) {
  auto* cmd = app.add_subcommand(
      "paper",
      "redraw the TSP paper's Figures 1, 5, 6, 7, 9, 10 as SVG and an HTML page with a "
      "published / tspemu / ratio table for every published number (analytic model, no ranks)");
  cmd->add_option("--out", a.out_dir, "directory for the SVG files, index.html and paper.json")
      ->capture_default_str();
  add_assumption_options(*cmd, a.assumptions);
  cmd->add_option("--json", a.json_path, "also write the table as JSON to this file");
  return cmd;
}

int paper_command(const PaperArgs& a, std::ostream& out) {
  check_output_files({{"--json", a.json_path}});
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(a.out_dir, ec);
  if (ec) throw ConfigError("--out " + a.out_dir + ": " + ec.message());
  const PaperReport r = paper_report(a);
  std::vector<std::string> svgs;
  for (const Figure& f : r.figures) {
    write_svg((fs::path(a.out_dir) / f.file).string(), f.title, f.panels);
    svgs.push_back(svg_chart(f.title, f.panels));
  }
  print_report(r, out);
  const fs::path index = fs::path(a.out_dir) / "index.html";
  {
    std::ofstream f(index);
    f << report_html(r, svgs);
    if (!f) throw std::runtime_error("cannot write " + index.string());
  }
  const nlohmann::json j = report_json(r);
  write_json((fs::path(a.out_dir) / "paper.json").string(), j);
  if (!a.json_path.empty()) write_json(a.json_path, j);
  out << "\nwrote " << index.string() << " and " << r.figures.size() << " SVG figures in "
      << a.out_dir << "\n";
  return 0;
}

}  // namespace tspemu::app
