#include "run_command.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <ostream>

#include "layer_stack.hpp"
#include "model_run.hpp"
#include "mpi_job.hpp"
#include "output_files.hpp"
#include "progress_bar.hpp"
#include "run_memory.hpp"
#include "stack_report.hpp"
#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/runtime/injection.hpp"

namespace tspemu::app {

CLI::App* add_run_command(CLI::App& app, RunArgs& a) {
  auto* run = app.add_subcommand(
      "run",
      "one training step (forward + backward) of one strategy, checked against the reference and "
      "the fp64 oracle, with memory per rank, bytes per collective vs the cost model, time (the "
      "default: TSP D=4 on a 2-layer model, 2048 tokens)");
  add_strategy_options(*run, a.problem);
  add_problem_options(*run, a.problem);
  add_grad_reduce_option(*run, a.problem);
  add_checkpoint_options(*run, a.checkpoint);
  run->add_flag("--layers-only", a.layers_only,
                "run the layer stack (seeded input and upstream gradient, no embedding, LM head "
                "or loss) instead of the whole model");
  run->add_flag("--no-check", a.no_check,
                "skip the reference and the oracle (traffic still checked)");
  run->add_flag("--quiet,-q", a.quiet, "no progress bar");
  run->add_option("--json", a.json_path, "also write the report as JSON to this file");
  run->add_option("--trace", a.trace_path,
                  "write every rank's events as Chrome trace JSON to this file (open it in "
                  "https://ui.perfetto.dev or chrome://tracing)");
  add_sim_clock_options(*run, a.sim_clock, false);
  run->add_option("--inject-seed", a.inject_seed,
                  "run under seeded injection: random delays of ranks and messages, receives "
                  "delivered in a seeded order; the same seed reproduces the event order");
  run->add_option("--inject-delay-us", a.inject_delay_us, "injection: longest delay, microseconds")
      ->capture_default_str();
  run->add_option("--inject-probability", a.inject_probability,
                  "injection: chance that an operation or a message is delayed")
      ->capture_default_str();
  run->add_option("--inject-failure-rank", a.inject_failure_rank,
                  "injection: this rank throws after its forward pass, to see how a failure is "
                  "reported (every rank stops, exit code 1)");
  return run;
}

int run_command(const RunArgs& a, std::ostream& out) {
  check_output_files({{"--json", a.json_path}, {"--trace", a.trace_path}});
  ProblemOptions problem = a.problem;
  const auto weights = load_checkpoint_option(a.checkpoint, problem);  // sets problem.model
  const tsp::cost::Strategy st = parse_strategy(problem);
  require_ranks_divisible(st.ranks(), problem.strategy == "tp-sp" ? "--tp x --sp" : "--ranks");
  const bool whole = !a.layers_only;
  StackConfig c = make_stack_config(problem, st, whole);
  c.weights = weights;
  c.check = !a.no_check;
  c.trace_path = a.trace_path;
  c.sim_clock = sim_clock_option(a.sim_clock, st.ranks());
  // A delay the runtime would refuse (Injection::validate) named by its flag, before any work.
  const std::chrono::milliseconds hang_timeout = stack_world_options(c, 1).hang_timeout;
  const auto delay_bound = max_injection_delay(hang_timeout);
  if (a.inject_delay_us < 0 || a.inject_delay_us > delay_bound.count())
    throw ConfigError("--inject-delay-us " + std::to_string(a.inject_delay_us) +
                      ": must be in [0, " + std::to_string(delay_bound.count()) +
                      "], a quarter of the " + std::to_string(hang_timeout.count() / 1000) +
                      " s hang timeout (a longer delay would fail the waiting ranks as hung)");
  if (!(a.inject_probability >= 0 && a.inject_probability <= 1))
    throw ConfigError("--inject-probability " + std::to_string(a.inject_probability) +
                      ": must be in [0, 1]");
  if (a.inject_failure_rank < -1 || a.inject_failure_rank >= st.ranks())
    throw ConfigError("--inject-failure-rank " + std::to_string(a.inject_failure_rank) +
                      ": must be a rank in [0, " + std::to_string(st.ranks()) + ") or -1 (none)");
  c.fail_rank = a.inject_failure_rank;
  if (a.inject_seed) {
    c.inject = Injection{.seed = *a.inject_seed,
                         .probability = a.inject_probability,
                         .max_delay = std::chrono::microseconds(a.inject_delay_us)};
  }
  require_run_memory(c, whole, "run " + st.name(), available_memory(),
                     stack_world_options(c, st.ranks()).arena_capacity);
  StackResult r;
  {
    ProgressBar bar("run " + st.name(), stack_steps(c, whole), !a.quiet);
    c.on_step = [&bar] { bar.step(); };
    r = whole ? run_model(c) : run_stack(c);
  }
  if (c.weights) out << "weights: the checkpoint in " << a.checkpoint.weights << "\n";
  print_report(out, c, r);
  if (mpi_job().prints()) save_checkpoint_option(a.checkpoint, initial_weights(c), out);
  if (!a.json_path.empty()) write_json(a.json_path, report_json(c, r));
  return r.pass() ? 0 : 1;
}

}  // namespace tspemu::app
