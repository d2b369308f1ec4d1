#include "cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <ostream>

#include "compare_command.hpp"
#include "config_file.hpp"
#include "mpi_job.hpp"
#include "paper_command.hpp"
#include "plan_command.hpp"
#include "run_command.hpp"
#include "scale_command.hpp"
#include "selfcheck.hpp"
#include "train_command.hpp"

namespace tspemu::app {

namespace {

// The subcommands' work, then their exit code (the body of tspemu_main once parsed).
int run_parsed(CLI::App* check, CLI::App* compare, CLI::App* plan, CLI::App* scale, CLI::App* paper,
               CLI::App* train, const SelfcheckOptions& sc, const RunArgs& run_args,
               const CompareArgs& compare_args, const PlanArgs& plan_args,
               const ScaleArgs& scale_args, const PaperArgs& paper_args,
               const TrainArgs& train_args, std::ostream& out, std::ostream& err) {
  try {
    if (check->parsed()) return selfcheck(sc, out) == 0 ? 0 : 1;
    if (compare->parsed()) return compare_command(compare_args, out);
    if (plan->parsed()) return plan_command(plan_args, out);
    if (scale->parsed()) return scale_command(scale_args, out);
    if (paper->parsed()) return paper_command(paper_args, out);
    if (train->parsed()) return train_command(train_args, out);
    return run_command(run_args, out);
  } catch (const std::invalid_argument& e) {
    err << "tspemu: invalid configuration: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "tspemu: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int tspemu_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app{
      "tspemu: emulate a multi-GPU device group on one CPU; with no subcommand, `run` on its "
      "built-in default",
      "tspemu"};
  app.require_subcommand(0, 1);
  // A --config file's options come first; the command line's later ones win.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  std::string unused_config;
  auto config = [&](CLI::App* sub) {
    sub->add_option("--config", unused_config,
                    "read options from a JSON object {\"long-option\": value, ...}; flags on the "
                    "command line override it");
  };
  RunArgs run_args;
  CLI::App* run = add_run_command(app, run_args);
  CompareArgs compare_args;
  CLI::App* compare = add_compare_command(app, compare_args);
  PlanArgs plan_args;
  CLI::App* plan = add_plan_command(app, plan_args);
  ScaleArgs scale_args;
  CLI::App* scale = add_scale_command(app, scale_args);
  PaperArgs paper_args;
  CLI::App* paper = add_paper_command(app, paper_args);
  TrainArgs train_args;
  CLI::App* train = add_train_command(app, train_args);
  for (CLI::App* sub : {run, compare, plan, scale, paper, train}) config(sub);

  SelfcheckOptions sc;
  auto* check = app.add_subcommand("selfcheck",
                                   "run and verify every collective of the runtime, with timings");
  check->add_option("--ranks", sc.ranks, "ranks (threads) in the world")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  check->add_option("--count", sc.count, "float elements per rank")->capture_default_str();
  check->add_option("--iterations", sc.iterations, "timed calls per collective")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  try {
    std::vector<std::string> argv = expand_config_files(app, args);
    std::reverse(argv.begin(), argv.end());  // CLI11 takes a vector in reverse order
    app.parse(argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err) == 0 ? 0 : 2;
  } catch (const std::invalid_argument& e) {
    err << "tspemu: invalid configuration: " << e.what() << "\n";
    return 2;
  }
  // Under mpirun (mpi_job.hpp) run, compare and scale span the job's processes and plan runs as
  // usual; the others would each run P independent copies of one world, which is no run across
  // processes.
  const MpiJob job = mpi_job();
  if (job.spans() && (check->parsed() || paper->parsed() || train->parsed())) {
    err << "tspemu: invalid configuration: launched by mpirun with " << job.processes
        << " processes, but "
        << (check->parsed()   ? "selfcheck"
            : paper->parsed() ? "paper"
                              : "train")
        << " does not span processes (each process would run its own independent world); run, "
           "compare, scale and plan do; run this one without mpirun (docs/mpi.md: The tspemu "
           "command under mpirun)\n";
    return 2;
  }
  // Process 0 prints; the others run their ranks silently (their errors still go to err).
  std::ostream silent(nullptr);
  std::ostream& report = job.prints() ? out : silent;
  const int code = run_parsed(check, compare, plan, scale, paper, train, sc, run_args, compare_args,
                              plan_args, scale_args, paper_args, train_args, report, err);
  // plan runs no world: every process computes the same code without MPI.
  return plan->parsed() ? code : agree_exit_code(code);
}

}  // namespace tspemu::app
