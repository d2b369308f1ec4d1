#include "cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <ostream>

#include "config_file.hpp"
#include "generate_command.hpp"
#include "mpi_job.hpp"
#include "option_table.hpp"

namespace tspemu::app {

TspemuApp::TspemuApp()
    : CLI::App(
          "tspemu: emulate a multi-GPU device group on one CPU; with no subcommand, `run` on "
          "its built-in default",
          "tspemu") {
  require_subcommand(0, 1);
  // A --config file's options come first; the command line's later ones win.
  option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  run = add_run_command(*this, args.run);
  compare = add_compare_command(*this, args.compare);
  plan = add_plan_command(*this, args.plan);
  scale = add_scale_command(*this, args.scale);
  paper = add_paper_command(*this, args.paper);
  train = add_train_command(*this, args.train);
  generate = add_generate_command(*this, args.generate);
  for (CLI::App* sub : {run, compare, plan, scale, paper, train, generate})
    sub->add_option("--config", args.config,
                    "read options from a JSON object {\"long-option\": value, ...}; flags on the "
                    "command line override it");
  selfcheck = add_selfcheck_command(*this, args.selfcheck);
  outside_the_table = apply_option_table(*this);
}

namespace {

// The subcommands' work, then their exit code (the body of tspemu_main once parsed).
int run_parsed(const TspemuApp& app, std::ostream& out, std::ostream& err) {
  const TspemuApp::Args& a = app.args;
  try {
    if (app.selfcheck->parsed()) return app::selfcheck(a.selfcheck, out) == 0 ? 0 : 1;
    if (app.compare->parsed()) return compare_command(a.compare, out);
    if (app.plan->parsed()) return plan_command(a.plan, out);
    if (app.scale->parsed()) return scale_command(a.scale, out);
    if (app.paper->parsed()) return paper_command(a.paper, out);
    if (app.train->parsed()) return train_command(a.train, out);
    if (app.generate->parsed()) return generate_command(a.generate, out);
    return run_command(a.run, out);
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
  TspemuApp app;
  CLI::App* const check = app.selfcheck;
  CLI::App* const paper = app.paper;
  CLI::App* const train = app.train;
  CLI::App* const plan = app.plan;
  CLI::App* const generate = app.generate;

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
  if (job.spans() &&
      (check->parsed() || paper->parsed() || train->parsed() || generate->parsed())) {
    err << "tspemu: invalid configuration: launched by mpirun with " << job.processes
        << " processes, but "
        << (check->parsed()   ? "selfcheck"
            : paper->parsed() ? "paper"
            : train->parsed() ? "train"
                              : "generate")
        << " does not span processes (each process would run its own independent world); run, "
           "compare, scale and plan do; run this one without mpirun (docs/mpi.md: The tspemu "
           "command under mpirun)\n";
    return 2;
  }
  // Process 0 prints; the others run their ranks silently (their errors still go to err).
  std::ostream silent(nullptr);
  std::ostream& report = job.prints() ? out : silent;
  const int code = run_parsed(app, report, err);
  // plan runs no world: every process computes the same code without MPI.
  return plan->parsed() ? code : agree_exit_code(code);
}

}  // namespace tspemu::app
