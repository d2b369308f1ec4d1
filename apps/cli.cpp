#include "cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <ostream>

#include "compare_command.hpp"
#include "config_file.hpp"
#include "paper_command.hpp"
#include "plan_command.hpp"
#include "run_command.hpp"
#include "scale_command.hpp"
#include "selfcheck.hpp"
#include "train_command.hpp"

namespace tspemu::app {

namespace {

// Processes in the mpirun job this process belongs to (OpenMPI's launcher sets the variable), 1
// when not launched by mpirun.
int mpirun_processes() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size != nullptr ? std::max(1, std::atoi(size)) : 1;
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
  // The commands do not span processes yet: under mpirun each process would run its own
  // complete, independent world (and write the same files), and P copies of a report are not a
  // run across processes. Only plan (no ranks, no files unless asked) runs as usual. A world
  // spanning processes is a library option (WorldOptions::mpi).
  if (const int p = mpirun_processes(); p > 1 && !plan->parsed()) {
    err << "tspemu: invalid configuration: launched by mpirun with " << p
        << " processes, but only plan runs under mpirun: the commands that run ranks do not span "
           "processes yet (each process would run its own independent world); run tspemu "
           "without mpirun, or build a program on tspemu::World with WorldOptions::mpi (README: "
           "Across processes)\n";
    return 2;
  }
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

}  // namespace tspemu::app
