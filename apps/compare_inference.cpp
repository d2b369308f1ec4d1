#include "compare_inference.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "generate_command.hpp"
#include "generate_run.hpp"
#include "mpi_job.hpp"
#include "output_files.hpp"
#include "progress_bar.hpp"
#include "stack_report.hpp"

namespace tspemu::app {

namespace {

// One strategy of the comparison: refused (skipped), failed while running (error), or its run.
struct InferenceRow {
  const DecodeStrategy* strategy = nullptr;
  int ranks = 1;
  std::string skipped;  // why_invalid's reason
  std::string error;    // what the run threw
  GenerateResult result;
  std::optional<bool> tokens_equal;  // to the reference decoder's; nullopt when either did not run
  bool ran() const { return skipped.empty() && error.empty(); }
  bool failed() const { return !error.empty() || (ran() && !result.pass()); }
};

// One collective kind of a row's decode steps, per step: the largest bytes received over the
// ranks, measured and modelled, the calls (rank 0's), and whether every rank's counts equal.
struct KindTraffic {
  CollectiveKind kind;
  double measured = 0, model = 0, calls = 0;
  bool match = true;
};

std::vector<KindTraffic> traffic_by_kind(const GenerateResult& r) {
  std::vector<KindTraffic> kinds;
  const double steps = static_cast<double>(std::max<std::size_t>(r.step_seconds.size(), 1));
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    KindTraffic t{.kind = static_cast<CollectiveKind>(k)};
    std::uint64_t measured = 0, model = 0, calls = 0;
    for (std::size_t i = 0; i < r.decode_traffic.size(); ++i) {
      const TrafficCounters::Entry& e = r.decode_traffic[i].by_kind[k];
      measured = std::max(measured, e.bytes_received);
      calls = std::max(calls, e.calls);
      if (i >= r.decode_model.size()) continue;
      const TrafficCounters::Entry& m = r.decode_model[i].by_kind[k];
      model = std::max(model, m.bytes_received);
      calls = std::max(calls, m.calls);
      t.match = t.match && e == m;
    }
    if (calls == 0) continue;
    t.measured = static_cast<double>(measured) / steps;
    t.model = static_cast<double>(model) / steps;
    t.calls = static_cast<double>(calls) / steps;
    kinds.push_back(t);
  }
  return kinds;
}

std::uint64_t max_of(const std::vector<std::uint64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// The rows of every strategy in the table: the reference on 1 rank, the others on D, each
// refused with its reason where the shape does not suit it.
std::vector<InferenceRow> plan_rows(const GenerateConfig& base, int D) {
  std::vector<InferenceRow> rows;
  for (const DecodeStrategy& st : decode_strategies()) {
    InferenceRow row;
    row.strategy = &st;
    row.ranks = &st == &decode_strategies().front() ? 1 : D;
    GenerateShape shape = base.shape;
    shape.ranks = row.ranks;
    if (const std::string why = st.why_invalid(shape); !why.empty())
      row.skipped = "--ranks " + std::to_string(row.ranks) + ": " + why;
    rows.push_back(std::move(row));
  }
  return rows;
}

void run_rows(const GenerateConfig& base, std::vector<InferenceRow>& rows, bool quiet) {
  const auto runnable = std::count_if(rows.begin(), rows.end(),
                                      [](const InferenceRow& r) { return r.skipped.empty(); });
  ProgressBar bar("compare --inference", static_cast<int>(runnable) * generate_steps(base), !quiet);
  for (InferenceRow& row : rows) {
    if (!row.skipped.empty()) continue;
    GenerateConfig c = base;
    c.strategy = row.strategy;
    c.shape.ranks = row.ranks;
    c.on_step = [&bar, &row] { bar.step(row.strategy->name); };
    try {
      row.result = run_generate(c);
    } catch (const std::exception& e) {  // a rank failed: the row fails, the others still run
      row.error = e.what();
    }
  }
  const InferenceRow& reference = rows.front();
  for (InferenceRow& row : rows)
    if (row.ran() && reference.ran())
      row.tokens_equal = row.result.tokens == reference.result.tokens;
}

std::string row_text(const InferenceRow& row) {
  const std::string head = fmt("%-12s %5d ", row.strategy->name.c_str(), row.ranks);
  if (!row.skipped.empty()) return head + " skipped: " + row.skipped + "\n";
  if (!row.error.empty()) return head + " FAIL: " + row.error + "\n";
  const GenerateResult& r = row.result;
  return head +
         fmt("%9.3f %9.3f %9.0f %12llu %12llu %4s %7s %4s %8s %s\n", r.ttft() * 1e3, r.tpot() * 1e3,
             r.tokens_per_s(), static_cast<unsigned long long>(max_of(r.kv_bytes)),
             static_cast<unsigned long long>(max_of(r.kv_model)), r.kv_match ? "yes" : "NO",
             r.decode_model.empty() ? "-"
             : r.traffic_match      ? "yes"
                                    : "NO",
             !row.tokens_equal   ? "-"
             : *row.tokens_equal ? "yes"
                                 : "no",
             r.checked ? fmt("%.3f", r.max_err_ratio).c_str() : "-", r.pass() ? "PASS" : "FAIL");
}

// Per row that ran decode steps: each collective kind, measured / model bytes per step.
void print_traffic(std::ostream& out, const std::vector<InferenceRow>& rows) {
  out << "\nper decode step, by collective kind: calls, and bytes received (max over ranks) "
         "measured / closed form:\n";
  for (const InferenceRow& row : rows) {
    if (!row.ran() || row.result.step_seconds.empty()) continue;
    const std::vector<KindTraffic> kinds = traffic_by_kind(row.result);
    std::string line;
    for (const KindTraffic& k : kinds)
      line += fmt("%s%s %g calls %.0f / ", line.empty() ? "" : "; ", collective_name(k.kind),
                  k.calls, k.measured) +
              (row.result.decode_model.empty() ? "-" : fmt("%.0f", k.model)) +
              (row.result.decode_model.empty() || k.match ? "" : " DIFFERENT");
    out << fmt("  %-12s ", row.strategy->name.c_str()) << (kinds.empty() ? "no collective" : line);
    out << "\n";
  }
}

void print_inference(std::ostream& out, const GenerateArgs& g, const GenerateConfig& base,
                     const std::string& context_source, const std::vector<InferenceRow>& rows,
                     int D) {
  out << fmt("tspemu compare --inference: every decode strategy, the reference on 1 rank and the "
             "others on %d, ",
             D)
      << generate_inputs_text(g, base, context_source) << "\n";
  out << fmt("%-12s %5s %9s %9s %9s %12s %12s %4s %7s %4s %8s %s\n", "strategy", "ranks", "TTFT ms",
             "TPOT ms", "tokens/s", "KV B/rank", "KV model", "KV", "traffic", "=ref", "err/bnd",
             "verdict");
  for (const InferenceRow& row : rows) out << row_text(row);
  print_traffic(out, rows);
  out << "\nTTFT: the prefill step; TPOT: the median decode step; tokens/s: B·N over the whole run"
         "\nKV B/rank: max over ranks of the KV cache bytes after the run (a strategy may reserve "
         "its cache for --max-context positions at prefill, as tsp-w does); KV model: the "
         "strategy's closed form; KV: every rank's equals it\ntraffic: every rank's calls and "
         "bytes per collective kind over the decode steps equal the strategy's closed form (-: it "
         "states none)\n=ref: the generated tokens equal the reference decoder's\nerr/bnd: max "
         "over steps of err(run) / (k·err(reference fp32) + tiny) against the fp64 oracle, "
         "teacher-forced on the run's tokens, pass <= 1; verdict: as `tspemu generate` judges "
         "it\n";
  std::string failed;
  for (const InferenceRow& row : rows)
    if (row.failed()) failed += (failed.empty() ? "" : ", ") + row.strategy->name;
  out << "\nverdict: "
      << (failed.empty() ? "PASS (every strategy that ran passed)" : "FAIL (" + failed + ")")
      << "\n";
}

nlohmann::json row_json(const InferenceRow& row) {
  nlohmann::json o = {
      {"strategy", row.strategy->name},
      {"ranks", row.ranks},
      {"skipped", row.skipped.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.skipped)},
      {"error", row.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.error)}};
  if (!row.ran()) {
    o["verdict"] = row.error.empty() ? "skipped" : "fail";
    return o;
  }
  const GenerateResult& r = row.result;
  nlohmann::json traffic = nlohmann::json::object();
  for (const KindTraffic& k : traffic_by_kind(r))
    traffic[collective_name(k.kind)] = {
        {"calls", k.calls},
        {"measured_bytes_received_max", k.measured},
        {"model_bytes_received_max",
         r.decode_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(k.model)},
        {"match", r.decode_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(k.match)}};
  o.update({{"ttft_seconds", r.ttft()},
            {"tpot_seconds", r.tpot()},
            {"tokens_per_s", r.tokens_per_s()},
            {"seconds", r.seconds},
            {"kv_cache",
             {{"measured_bytes_max", max_of(r.kv_bytes)},
              {"model_bytes_max", max_of(r.kv_model)},
              {"measured_bytes_per_rank", r.kv_bytes},
              {"model_bytes_per_rank", r.kv_model},
              {"formula", row.strategy->kv_formula},
              {"match", r.kv_match}}},
            {"decode_traffic_per_step", traffic},
            {"decode_traffic_match",
             r.decode_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.traffic_match)},
            {"tokens_equal_reference",
             row.tokens_equal ? nlohmann::json(*row.tokens_equal) : nlohmann::json(nullptr)},
            {"checked", r.checked},
            {"max_err_ratio", r.checked ? nlohmann::json(r.max_err_ratio) : nlohmann::json()},
            {"tokens", r.tokens},
            {"verdict", r.pass() ? "pass" : "fail"}});
  return o;
}

nlohmann::json inference_json(const GenerateArgs& g, const GenerateConfig& base,
                              const std::vector<InferenceRow>& rows, int D) {
  nlohmann::json j = document("compare");
  j["config"] = generate_inputs_json(g, base);
  j["config"]["inference"] = true;
  j["config"]["ranks"] = D;
  j["rows"] = nlohmann::json::array();
  bool pass = true;
  for (const InferenceRow& row : rows) {
    j["rows"].push_back(row_json(row));
    pass = pass && !row.failed();
  }
  j["verdict"] = pass ? "pass" : "fail";
  j["pass"] = pass;
  return j;
}

}  // namespace

int compare_inference(const CompareArgs& a, std::ostream& out) {
  check_output_files({{"--json", a.json_path}});
  if (mpi_job().spans())
    throw ConfigError(
        "compare --inference does not span processes (each process would run its own "
        "independent world); run it without mpirun");
  GenerateArgs g = a.decode;  // generate's flags, with compare's model, seed and check flags
  g.problem = a.problem;
  g.strategy = decode_strategies().front().name;  // the reference checks every shape's input
  g.ranks = 1;
  g.check = !a.no_check;
  g.quiet = a.quiet;
  std::string context_source;
  const GenerateConfig base = make_generate_config(g, context_source);
  std::vector<InferenceRow> rows = plan_rows(base, a.problem.ranks);
  run_rows(base, rows, a.quiet);
  print_inference(out, g, base, context_source, rows, a.problem.ranks);
  const nlohmann::json j = inference_json(g, base, rows, a.problem.ranks);
  if (!a.json_path.empty()) write_json(a.json_path, j);
  return j["pass"].get<bool>() ? 0 : 1;
}

}  // namespace tspemu::app
