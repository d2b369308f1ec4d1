#include "scale_command.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "mpi_job.hpp"
#include "output_files.hpp"
#include "progress_bar.hpp"
#include "run_memory.hpp"
#include "stack_report.hpp"
#include "svg_chart.hpp"
#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/blas_kernel.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

CLI::App* add_scale_command(CLI::App& app, ScaleArgs& a) {
  auto* cmd = app.add_subcommand(
      "scale",
      "CPU scaling of one strategy: strong (fixed problem, D = 1, 2, 4 ... --max-ranks) and weak "
      "(fixed tokens per rank) scaling, tokens/s and parallel efficiency, table, JSON and SVG");
  std::vector<std::string> one_axis;  // the degree D is the one --max-ranks steps through
  for (const tsp::StrategyInfo& e : tsp::strategies())
    if (e.mesh == tsp::MeshKind::one_axis) one_axis.emplace_back(e.name);
  std::string names;
  for (const std::string& n : one_axis) names += (names.empty() ? "" : ", ") + n;
  cmd->add_option("--strategy", a.problem.strategy, names)
      ->capture_default_str()
      ->check(CLI::IsMember(one_axis));
  cmd->add_option("--max-ranks,-N", a.max_ranks, "largest degree D (powers of two up to it)")
      ->capture_default_str();
  cmd->add_option("--mode", a.mode, "strong, weak or both")
      ->capture_default_str()
      ->check(CLI::IsMember({"strong", "weak", "both"}));
  cmd->add_option("--repeat", a.repeat, "timed runs per point (the median is reported)")
      ->capture_default_str();
  // Every degree up to the default --max-ranks 8 must divide the KV heads (TSP and TP shard them),
  // so scale defaults to 8 of them where run and compare keep the GQA default of 4.
  a.problem.model.n_kv_heads = 8;
  add_problem_options(*cmd, a.problem);
  add_grad_reduce_option(*cmd, a.problem);
  cmd->add_flag("--quiet,-q", a.quiet, "no progress bar");
  cmd->add_option("--json", a.json_path, "also write the table as JSON to this file");
  cmd->add_option("--svg", a.svg_path, "also write a chart of tokens/s and efficiency (SVG)");
  return cmd;
}

namespace {

struct Point {
  std::string mode;
  int D = 1, S = 0;
  std::string skipped;
  double seconds = 0, tokens_per_s = 0, speedup = 0, efficiency = 0;
  bool match = false;
};

// Under mpirun (mpi_job.hpp) a degree the job's P processes do not divide cannot run.
std::string why_not_run(const ProblemOptions& p, const cost::Strategy& st) {
  const MpiJob job = mpi_job();
  if (job.spans() && p.ranks % job.processes != 0)
    return "D=" + std::to_string(p.ranks) + " is not a multiple of the " +
           std::to_string(job.processes) + " mpirun processes";
  return why_invalid(p, st);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The sweep: which points, and what they measured.
struct ScaleReport {
  int per_rank = 0;  // weak scaling's tokens per rank
  int cores = 1;
  std::string efficiency_definition;
  std::vector<int> degrees;
  std::vector<std::string> modes;
  std::vector<Point> points;
  bool all_match = true;
};

// The problem of one point of the sweep.
ProblemOptions point_problem(const ScaleArgs& a, const ScaleReport& rep, const std::string& mode,
                             int D) {
  ProblemOptions p = a.problem;
  p.ranks = D;
  if (mode == "weak") p.S = rep.per_rank * D;
  return p;
}

// The sweep's points (degrees 1, 2, 4 ... --max-ranks, per mode), checked before anything runs:
// some point must be valid (a table of skipped points is no scaling curve) and every valid point
// must fit in memory.
ScaleReport plan_sweep(const ScaleArgs& a) {
  if (a.max_ranks < 1 || a.max_ranks > 256)
    throw ConfigError("--max-ranks " + std::to_string(a.max_ranks) + ": must be 1 to 256");
  if (a.repeat < 1) throw ConfigError("--repeat " + std::to_string(a.repeat) + ": must be >= 1");
  ScaleReport rep;
  rep.per_rank = a.problem.S / a.max_ranks;
  if ((a.mode != "strong") && rep.per_rank < 1)
    throw ConfigError("--seq " + std::to_string(a.problem.S) +
                      ": weak scaling needs at least one token per rank at --max-ranks " +
                      std::to_string(a.max_ranks));
  rep.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Under mpirun the smallest degree is the job's P processes (one rank each), not 1.
  rep.efficiency_definition =
      mpi_job().spans()
          ? "(tokens/s at D / tokens/s at the first D that ran) / (min(D, cores) / min(that D, "
            "cores)), across " +
                std::to_string(mpi_job().processes) + " mpirun processes"
          : "(tokens/s at D / tokens/s at D=1) / min(D, cores)";
  for (int D = 1; D <= a.max_ranks; D *= 2) rep.degrees.push_back(D);
  if (a.mode != "weak") rep.modes.push_back("strong");
  if (a.mode != "strong") rep.modes.push_back("weak");
  std::string reasons;
  bool any_runs = false;
  for (const std::string& mode : rep.modes)
    for (int D : rep.degrees) {
      const ProblemOptions p = point_problem(a, rep, mode, D);
      const cost::Strategy st = parse_strategy(p);
      if (const std::string why = why_not_run(p, st); !why.empty()) {
        reasons += "; " + mode + " D=" + std::to_string(D) + ": " + why;
        continue;
      }
      any_runs = true;
      StackConfig c = make_stack_config(p, st);
      c.check = false;
      require_run_memory(c, false, "scale point " + mode + " D=" + std::to_string(D),
                         available_memory(), stack_world_options(c, D).arena_capacity);
    }
  if (!any_runs)
    throw ConfigError("--max-ranks " + std::to_string(a.max_ranks) +
                      ": no point of the sweep can run this configuration" + reasons);
  return rep;
}

// Runs every point --repeat times (the median time counts).
void run_sweep(const ScaleArgs& a, ScaleReport& rep) {
  ProgressBar bar("scale", static_cast<int>(rep.modes.size() * rep.degrees.size()) * a.repeat,
                  !a.quiet);
  for (const std::string& mode : rep.modes) {
    double base = 0;
    int base_D = 1;
    for (int D : rep.degrees) {
      const ProblemOptions p = point_problem(a, rep, mode, D);
      Point pt{mode, D, p.S, {}, 0, 0, 0, 0, false};
      const cost::Strategy st = parse_strategy(p);
      pt.skipped = why_not_run(p, st);
      if (!pt.skipped.empty()) {
        for (int i = 0; i < a.repeat; ++i) bar.step();
        rep.points.push_back(pt);
        continue;
      }
      StackConfig c = make_stack_config(p, st);
      c.check = false;
      std::vector<double> secs;
      pt.match = true;
      for (int i = 0; i < a.repeat; ++i) {
        const StackResult r = run_stack(c);
        secs.push_back(r.seconds);
        pt.match = pt.match && r.traffic_match;
        bar.step(st.name());
      }
      rep.all_match = rep.all_match && pt.match;
      pt.seconds = median(secs);
      pt.tokens_per_s = static_cast<double>(p.B) * p.S / pt.seconds;
      // The base is D=1, or under mpirun the smallest degree the processes divide (D0 = P).
      if (base == 0) {
        base = pt.tokens_per_s;
        base_D = D;
      }
      pt.speedup = pt.tokens_per_s / base;
      pt.efficiency = pt.speedup * std::min(base_D, rep.cores) / std::min(D, rep.cores);
      rep.points.push_back(pt);
    }
  }
}

void print_sweep(std::ostream& out, const ScaleArgs& a, const ScaleReport& rep) {
  out << fmt(
      "tspemu scale: %s, layer stack of %d x (attention + MLP), forward + backward, "
      "B=%d, model %s\nblas: %s\nbf16 gemm: %s\ncores available: %d; median of %d runs per "
      "point\nstrong: S=%d at every D; weak: S = D x %d tokens per rank\nefficiency = %s\n\n",
      a.problem.strategy.c_str(), a.problem.model.n_layers, a.problem.B,
      a.problem.model.to_string().c_str(), ref::describe_blas().c_str(),
      ref::describe_bf16_gemm().c_str(), rep.cores, a.repeat, a.problem.S, rep.per_rank,
      rep.efficiency_definition.c_str());
  out << fmt("%-7s %4s %7s %11s %10s %12s %8s %6s %s\n", "mode", "D", "S", "tokens/rank", "time ms",
             "tokens/s", "speedup", "effic", "model");
  for (const Point& pt : rep.points)
    out << (pt.skipped.empty()
                ? fmt("%-7s %4d %7d %11d %10.1f %12.0f %8.2f %6.2f %s\n", pt.mode.c_str(), pt.D,
                      pt.S, pt.S / pt.D, pt.seconds * 1e3, pt.tokens_per_s, pt.speedup,
                      pt.efficiency, pt.match ? "yes" : "NO")
                : fmt("%-7s %4d %7d  skipped: %s\n", pt.mode.c_str(), pt.D, pt.S,
                      pt.skipped.c_str()));
  out << "\nmodel: every rank's bytes per collective equal the cost model's. On a machine with\n"
         "fewer cores than ranks the ranks share cores: efficiency is against min(D, cores).\n";
}

nlohmann::json sweep_json(const ScaleArgs& a, const ScaleReport& rep) {
  nlohmann::json j = document("scale");
  j["config"] = {{"strategy", a.problem.strategy},
                 {"max_ranks", a.max_ranks},
                 {"mode", a.mode},
                 {"repeat", a.repeat},
                 {"B", a.problem.B},
                 {"S", a.problem.S},
                 {"tokens_per_rank_weak", rep.per_rank},
                 {"model", a.problem.model.to_string()},
                 {"pin", a.problem.pin}};
  j["cores"] = rep.cores;
  j["efficiency_definition"] = rep.efficiency_definition;
  j["processes"] = mpi_job().processes;
  j["rows"] = nlohmann::json::array();
  for (const Point& pt : rep.points) {
    nlohmann::json row = {{"mode", pt.mode}, {"D", pt.D}, {"S", pt.S}};
    if (!pt.skipped.empty()) {
      row["skipped"] = pt.skipped;
    } else {
      row.update({{"skipped", nullptr},
                  {"seconds", pt.seconds},
                  {"tokens_per_s", pt.tokens_per_s},
                  {"efficiency", pt.efficiency},
                  {"model_match", pt.match}});
    }
    j["rows"].push_back(row);
  }
  return j;
}

void write_sweep_svg(const ScaleArgs& a, const ScaleReport& rep) {
  Panel tps{"tokens/s", "ranks D", "tokens per second", true, {}, {}, {}, {}};
  Panel eff{"parallel efficiency", "ranks D", rep.efficiency_definition, true, {}, {}, {}, {}};
  for (const std::string& mode : rep.modes) {
    Series s1{mode, {}, false}, s2{mode, {}, false};
    for (const Point& pt : rep.points)
      if (pt.mode == mode && pt.skipped.empty()) {
        s1.points.emplace_back(pt.D, pt.tokens_per_s);
        s2.points.emplace_back(pt.D, pt.efficiency);
      }
    tps.series.push_back(s1);
    eff.series.push_back(s2);
  }
  eff.hlines.emplace_back(1.0, "ideal");
  write_svg(a.svg_path,
            "tspemu scale: " + a.problem.strategy + " (" + std::to_string(rep.cores) + " cores)",
            {tps, eff});
}

}  // namespace

int scale_command(const ScaleArgs& a, std::ostream& out) {
  check_output_files({{"--json", a.json_path}, {"--svg", a.svg_path}});
  ScaleReport rep = plan_sweep(a);
  run_sweep(a, rep);
  print_sweep(out, a, rep);
  if (!a.json_path.empty()) write_json(a.json_path, sweep_json(a, rep));
  if (!a.svg_path.empty()) write_sweep_svg(a, rep);
  return rep.all_match ? 0 : 1;
}

}  // namespace tspemu::app
