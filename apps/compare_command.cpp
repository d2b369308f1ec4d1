#include "compare_command.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "compare_inference.hpp"
#include "model_run.hpp"
#include "mpi_job.hpp"
#include "output_files.hpp"
#include "progress_bar.hpp"
#include "run_memory.hpp"
#include "stack_report.hpp"
#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/blas_kernel.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

CLI::App* add_compare_command(CLI::App& app, CompareArgs& a) {
  auto* cmd = app.add_subcommand(
      "compare",
      "every strategy on one configuration at --ranks N, side by side: time, tokens/s, peak "
      "memory, bytes moved vs the cost model, error vs the fp64 oracle (whole model)");
  cmd->add_option("--ranks,-D", a.problem.ranks, "ranks N every strategy runs on")
      ->capture_default_str();
  add_problem_options(*cmd, a.problem);
  add_grad_reduce_option(*cmd, a.problem);
  cmd->add_flag("--layers-only", a.layers_only,
                "run each strategy's layer stack (no embedding, LM head or loss) instead of the "
                "whole model");
  cmd->add_flag("--no-check", a.no_check, "skip the reference and the oracle");
  cmd->add_flag("--quiet,-q", a.quiet, "no progress bar");
  cmd->add_option("--json", a.json_path, "also write the table as JSON to this file");
  add_sim_clock_options(*cmd, a.sim_clock, true);
  cmd->add_flag("--inference", a.inference,
                "compare the decode strategies instead (tspemu generate's runs and checks): the "
                "same prompts through every one, the reference decoder on 1 rank and the others on "
                "--ranks; time to first token, time per output token, tokens/s, KV cache and bytes "
                "per collective vs their closed forms, tokens vs the reference's, verdict");
  a.decode_flags = add_decode_options(*cmd, a.decode);
  for (const char* flag :
       {"--batch", "--seq", "--layout", "--head-buckets", "--serial-attention", "--layers-only",
        "--sim-clock", "--peak", "--mfu", "--gpus-per-node", "--intra-alpha-us", "--intra-beta-gbs",
        "--inter-alpha-us", "--inter-beta-gbs", "--nodes"})
    a.training_flags.push_back(cmd->get_option(flag));
  return cmd;
}

namespace {

// One row of the comparison: a strategy that ran (result) or was skipped (why).
struct CompareRow {
  cost::Strategy strategy;
  std::string skipped;  // non-empty: the reason it did not run
  StackResult result;
  Summary summary;
  bool checked = false;
};

struct CompareReport {
  bool whole = true;
  std::optional<SimClockModel> sim;
  std::vector<CompareRow> rows;
  bool all_ok = true;
};

// Before anything runs: a table of skipped rows is not a comparison, and every row that runs
// must fit in memory.
void validate_rows(const CompareArgs& a, const std::vector<cost::Strategy>& strategies) {
  const ProblemOptions& p = a.problem;
  const bool whole = !a.layers_only;
  std::string reasons;
  bool any_runs = false;
  for (const cost::Strategy& st : strategies) {
    if (const std::string why = why_invalid(p, st, whole); !why.empty()) {
      reasons += "; " + st.name() + ": " + why;
      continue;
    }
    any_runs = true;
    StackConfig c = make_stack_config(p, st, whole);
    c.check = !a.no_check;
    require_run_memory(c, whole, "compare row " + st.name(), available_memory(),
                       stack_world_options(c, st.ranks()).arena_capacity);
  }
  if (!any_runs)
    throw ConfigError("--ranks " + std::to_string(p.ranks) +
                      ": no strategy can run this configuration" + reasons);
}

// Runs every strategy at p.ranks (or records why it cannot).
CompareReport run_compare(const CompareArgs& a, const std::vector<cost::Strategy>& strategies,
                          const std::optional<SimClockModel>& sim) {
  const ProblemOptions& p = a.problem;
  CompareReport rep;
  rep.whole = !a.layers_only;
  rep.sim = sim;
  ProgressBar bar("compare", static_cast<int>(strategies.size()), !a.quiet);
  for (const cost::Strategy& st : strategies) {
    CompareRow row;
    row.strategy = st;
    row.skipped = why_invalid(p, st, rep.whole);
    if (row.skipped.empty()) {
      StackConfig c = make_stack_config(p, st, rep.whole);
      c.check = !a.no_check;
      c.sim_clock = sim;
      row.result = rep.whole ? run_model(c) : run_stack(c);
      row.summary = summarize(row.result);
      row.checked = c.check;
      rep.all_ok = rep.all_ok && row.result.pass();
    }
    rep.rows.push_back(std::move(row));
    bar.step(st.name());
  }
  return rep;
}

// The table row of one strategy that ran, with the slowest rank's simulated split (with a
// simulated clock); per_rank gets the simulated split of every rank.
std::string row_text(const CompareReport& rep, const CompareRow& row, std::string& per_rank) {
  const StackResult& r = row.result;
  const Summary& s = row.summary;
  const std::string name = padded(row.strategy.name(), 20);
  std::string text =
      fmt("%s %5d %9.1f %11.0f %10s %10s %10s %6s %8s %-7s", name.c_str(), row.strategy.ranks(),
          r.seconds * 1e3, r.tokens_per_s, mib(s.peak_bytes).c_str(), mib(s.forward_bytes).c_str(),
          mib(s.backward_bytes).c_str(), r.traffic_match ? "yes" : "NO",
          row.checked ? std::to_string(r.max_err_ratio).substr(0, 6).c_str() : "-",
          r.pass() ? "PASS" : "FAIL");
  if (rep.sim) {
    const World::SimulatedTime& t = r.simulated_time[static_cast<std::size_t>(r.slowest_rank)];
    text += fmt(" %8.3f %8.3f %8.3f %8.3f", r.simulated_seconds * 1e3, t.compute * 1e3,
                t.exposed_comm * 1e3, t.overlapped_comm * 1e3);
    per_rank += name;
    for (const World::SimulatedTime& rt : r.simulated_time)
      per_rank +=
          fmt(" %.3f/%.3f/%.3f", rt.compute * 1e3, rt.exposed_comm * 1e3, rt.overlapped_comm * 1e3);
    per_rank += "\n";
  }
  return text + "\n";
}

void print_compare(std::ostream& out, const ProblemOptions& p, const CompareReport& rep) {
  out << fmt(
      "tspemu compare: %d ranks, B=%d, S=%d, model %s\nran: per strategy %s, forward + "
      "backward\nblas: %s\nbf16 gemm: %s\n\n",
      p.ranks, p.B, p.S, p.model.to_string().c_str(),
      rep.whole ? "the whole model (embedding, layers, final norm, LM head, loss)"
                : "the layer stack (attention + MLP blocks); no embedding/LM head",
      ref::describe_blas().c_str(), ref::describe_bf16_gemm().c_str());
  out << fmt("%-20s %5s %9s %11s %10s %10s %10s %6s %8s %s%s\n", "strategy", "ranks", "time ms",
             "tokens/s", "peak MiB", "fwd MiB", "bwd MiB", "model", "err/bnd", "verdict",
             rep.sim ? "  sim ms  comp ms   exp ms   ovl ms" : "");
  std::string per_rank;  // the simulated split of every rank, printed after the table
  for (const CompareRow& row : rep.rows)
    out << (row.skipped.empty()
                ? row_text(rep, row, per_rank)
                : fmt("%s %5d  skipped: %s\n", padded(row.strategy.name(), 20).c_str(),
                      row.strategy.ranks(), row.skipped.c_str()));
  out << "\npeak MiB: max over ranks of the arena peak; fwd/bwd MiB: max over ranks of the bytes "
         "received; model: every rank's bytes and calls per collective equal the cost model; "
         "err/bnd: max over tensors of err(parallel) / (k·err(reference) + tiny), pass <= 1\n";
  if (rep.sim) {
    out << "sim ms: the simulated step, " << rep.sim->describe()
        << "; compute charged for the blocks' GEMM and attention spans; comp/exp/ovl ms: the "
           "slowest rank's compute, exposed and overlapped communication (overlapped: the "
           "compute that ran while a non-blocking collective was in flight)\n";
    out << "\nsimulated time per rank, ms: compute/exposed/overlapped communication, rank 0 first\n"
        << per_rank;
  }
}

nlohmann::json compare_json(const ProblemOptions& p, const CompareReport& rep) {
  nlohmann::json j = document("compare");
  j["config"] = {{"ranks", p.ranks},
                 {"B", p.B},
                 {"S", p.S},
                 {"model", p.model.to_string()},
                 {"whole_model", rep.whole}};
  j["rows"] = nlohmann::json::array();
  for (const CompareRow& row : rep.rows) {
    nlohmann::json o = {{"strategy", row.strategy.name()}, {"ranks", row.strategy.ranks()}};
    if (!row.skipped.empty()) {
      o["skipped"] = row.skipped;
      j["rows"].push_back(o);
      continue;
    }
    const StackResult& r = row.result;
    if (rep.sim) {
      o["simulated_seconds"] = r.simulated_seconds;
      o["simulated_per_rank"] = simulated_time_json(r);
    }
    o.update({{"skipped", nullptr},
              {"seconds", r.seconds},
              {"tokens_per_s", r.tokens_per_s},
              {"peak_bytes_per_rank", row.summary.peak_bytes},
              {"forward_bytes_per_rank", row.summary.forward_bytes},
              {"backward_bytes_per_rank", row.summary.backward_bytes},
              {"model_match", r.traffic_match},
              {"checked", row.checked},
              {"max_err_ratio", r.max_err_ratio},
              {"verdict", r.pass() ? "pass" : "fail"}});
    j["rows"].push_back(o);
  }
  if (rep.sim) j["simulated"] = sim_clock_json(*rep.sim);
  return j;
}

// The flags of the other mode, refused before anything runs.
void refuse_other_mode(const CompareArgs& a) {
  for (const CLI::Option* f : a.inference ? a.training_flags : a.decode_flags) {
    if (f == nullptr || f->count() == 0) continue;
    const std::string flag = f->get_name();
    if (!a.inference) throw ConfigError(flag + " needs --inference (a decoding flag)");
    throw ConfigError(flag + " belongs to the training comparison, not to --inference" +
                      (flag == "--batch" || flag == "--seq"
                           ? " (there the prompts are --prompt-lengths or --prompt, one sequence "
                             "per prompt)"
                           : ""));
  }
}

}  // namespace

int compare_command(const CompareArgs& a, std::ostream& out) {
  refuse_other_mode(a);
  if (a.inference) return compare_inference(a, out);
  const ProblemOptions& p = a.problem;
  check_output_files({{"--json", a.json_path}});
  if (p.ranks < 1 || p.ranks > 256)
    throw ConfigError("--ranks " + std::to_string(p.ranks) + ": must be 1 to 256");
  require_ranks_divisible(p.ranks, "--ranks");
  // Problems common to every strategy are configuration errors, not skipped rows.
  if (const std::string why = why_invalid(p, cost::Strategy::tsp(1), !a.layers_only); !why.empty())
    throw ConfigError(why);
  const std::optional<SimClockModel> sim = sim_clock_option(a.sim_clock, p.ranks);
  const auto strategies = tsp::strategies_at(p.ranks);
  validate_rows(a, strategies);
  const CompareReport rep = run_compare(a, strategies, sim);
  print_compare(out, p, rep);
  if (!a.json_path.empty()) write_json(a.json_path, compare_json(p, rep));
  return rep.all_ok ? 0 : 1;
}

}  // namespace tspemu::app
