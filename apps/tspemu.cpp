// The tspemu command. `tspemu run` is the main job; until the TSP blocks land it runs the runtime
// self-check on its defaults.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "selfcheck.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tspemu: emulate a multi-GPU device group on one CPU"};
  app.require_subcommand(0, 1);
  tspemu::app::SelfcheckOptions sc;
  auto add_selfcheck_options = [&](CLI::App* cmd) {
    cmd->add_option("--ranks", sc.ranks, "ranks (threads) in the world")
        ->capture_default_str()
        ->check(CLI::Range(1, 256));
    cmd->add_option("--count", sc.count, "float elements per rank")->capture_default_str();
    cmd->add_option("--iterations", sc.iterations, "timed calls per collective")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
  };
  auto* run = app.add_subcommand("run", "the main job (currently: the runtime self-check)");
  add_selfcheck_options(run);
  auto* check = app.add_subcommand("selfcheck", "run and verify every collective, with timings");
  add_selfcheck_options(check);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return tspemu::app::selfcheck(sc, std::cout) == 0 ? 0 : 1;
  } catch (const std::invalid_argument& e) {
    std::cerr << "tspemu: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tspemu: " << e.what() << "\n";
    return 1;
  }
}
