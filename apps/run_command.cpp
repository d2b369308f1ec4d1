#include "run_command.hpp"

#include <ostream>

#include "progress_bar.hpp"
#include "stack_report.hpp"
#include "tsp_run.hpp"

namespace tspemu::app {

CLI::App* add_run_command(CLI::App& app, RunArgs& a) {
  auto* run = app.add_subcommand(
      "run",
      "one training step (forward + backward) of one strategy, checked against the reference and "
      "the fp64 oracle, with memory per rank, bytes per collective vs the cost model, time (the "
      "default: TSP D=4 on a 2-layer model, 2048 tokens)");
  add_strategy_options(*run, a.problem);
  add_problem_options(*run, a.problem);
  run->add_flag("--layers-only", a.layers_only,
                "TSP: run the layer stack (as the baselines) instead of the whole model");
  run->add_flag("--no-check", a.no_check,
                "skip the reference and the oracle (traffic still checked)");
  run->add_flag("--quiet,-q", a.quiet, "no progress bar");
  run->add_option("--json", a.json_path, "also write the report as JSON to this file");
  return run;
}

int run_command(const RunArgs& a, std::ostream& out) {
  const tsp::cost::Strategy st = parse_strategy(a.problem);
  const bool whole = st.scheme == tsp::cost::Scheme::tsp && !a.layers_only;
  StackConfig c = make_stack_config(a.problem, st, whole);
  c.check = !a.no_check;
  StackResult r;
  {
    ProgressBar bar("run " + st.name(), stack_steps(c, whole), !a.quiet);
    c.on_step = [&bar] { bar.step(); };
    r = whole ? run_tsp_model(c) : run_stack(c);
  }
  print_report(out, c, r);
  if (!a.json_path.empty()) write_json(a.json_path, report_json(c, r));
  return r.pass() ? 0 : 1;
}

}  // namespace tspemu::app
