// The tspemu command line: subcommands run (the default), compare, plan, paper, scale, train,
// generate and selfcheck.
// Exit codes: 0 success; 1 a runtime failure or a failed check; 2 a bad configuration (the
// message names the flag and the constraint) or a command-line error.
#pragma once

#include <CLI/CLI.hpp>

#include <iosfwd>
#include <string>
#include <vector>

#include "compare_command.hpp"
#include "generate_command.hpp"
#include "paper_command.hpp"
#include "plan_command.hpp"
#include "run_command.hpp"
#include "scale_command.hpp"
#include "selfcheck.hpp"
#include "train_command.hpp"
#include "tspemu_main.hpp"

namespace tspemu::app {

// The parser: every subcommand with its options bound to `args`, each valued option checked by its
// row of the option table (option_table.hpp) as it is parsed.
class TspemuApp : public CLI::App {
 public:
  TspemuApp();
  struct Args {
    RunArgs run;
    CompareArgs compare;
    PlanArgs plan;
    ScaleArgs scale;
    PaperArgs paper;
    TrainArgs train;
    GenerateArgs generate;
    SelfcheckOptions selfcheck;
    std::string config;  // unused: --config is expanded before parsing (config_file.hpp)
  } args;
  CLI::App *run, *compare, *plan, *scale, *paper, *train, *generate, *selfcheck;
  // Options no row of the table covers, as "command --flag" (none in a correct build).
  std::vector<std::string> outside_the_table;
};

}  // namespace tspemu::app
