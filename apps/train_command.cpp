#include "train_command.hpp"

#include <CLI/CLI.hpp>

#include <ostream>

#include "corpus.hpp"
#include "output_files.hpp"
#include "progress_bar.hpp"
#include "run_memory.hpp"
#include "stack_report.hpp"
#include "svg_chart.hpp"
#include "train_run.hpp"
#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/blas_kernel.hpp"

namespace tspemu::app {

TrainArgs::TrainArgs() {
  problem.S = 256;
}

CLI::App* add_train_command(CLI::App& app, TrainArgs& a) {
  auto* train = app.add_subcommand(
      "train",
      "N optimizer steps of one strategy and of the single-thread reference side by side on a "
      "corpus, each step's loss and updated weights checked against the fp64 oracle's "
      "trajectory (the default: TSP D=4, whole model, AdamW, 60 steps of 256 tokens, about a "
      "minute on 2 cores); every strategy trains its whole model (--layers-only: its layer stack "
      "on a stand-in objective)");
  add_strategy_options(*train, a.problem);
  add_problem_options(*train, a.problem);
  add_grad_reduce_option(*train, a.problem);
  add_checkpoint_options(*train, a.checkpoint);
  train->add_flag("--layers-only", a.layers_only,
                  "train the layer stack (input: frozen embedding of each token; loss: mean "
                  "squared distance to the next token's) instead of the whole model");
  train->add_option("--steps", a.steps, "optimizer steps")->capture_default_str();
  train->add_option("--optimizer", a.optimizer, "adamw or sgd (fp32 state)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd"}));
  train->add_option("--lr", a.opt.lr, "learning rate")->capture_default_str();
  train->add_option("--beta1", a.opt.beta1, "AdamW beta1")->capture_default_str();
  train->add_option("--beta2", a.opt.beta2, "AdamW beta2")->capture_default_str();
  train->add_option("--eps", a.opt.eps, "AdamW eps")->capture_default_str();
  train
      ->add_option("--weight-decay", a.opt.weight_decay,
                   "decoupled weight decay of the matrices (not the norm weights)")
      ->capture_default_str();
  train->add_option("--data", a.data,
                    "corpus: FILE.tokens (token ids, whitespace-separated) or a UTF-8 text "
                    "(byte-level tokens; --vocab >= 256); default: the built-in corpus");
  train->add_flag("--quiet,-q", a.quiet, "no progress bar");
  train->add_option("--json", a.json_path, "also write the run as JSON to this file");
  train->add_option("--svg", a.svg_path,
                    "write an SVG chart of the loss curves and the per-step error ratio");
  add_pipeline_train_options(*train, a.pipeline);
  return train;
}

namespace {

nlohmann::json train_json(const TrainConfig& c, const TrainResult& r) {
  nlohmann::json j = document("train");
  j["config"] = config_json(c.stack);
  j["config"]["steps"] = c.steps;
  j["config"]["optimizer"] = c.optimizer.to_string();
  j["config"]["corpus"] = c.corpus_name;
  j["scope"] = r.scope;
  j["rule"] = "err(parallel fp32 vs fp64 trajectory) <= k * err(reference fp32 vs fp64) + tiny";
  j["k"] = c.stack.k;
  j["seconds"] = r.seconds;
  j["reference_seconds"] = r.reference_seconds;
  for (const TrainStep& s : r.steps)
    j["steps"].push_back({{"step", s.step},
                          {"loss", s.loss},
                          {"reference_loss", s.reference_loss},
                          {"oracle_loss", s.oracle_loss},
                          {"seconds", s.seconds},
                          {"err_ratio", s.err_ratio},
                          {"worst_tensor", s.worst}});
  auto bytes = [](const ModelStateBytes& b) {
    return nlohmann::json{
        {"weights", b.weights}, {"gradients", b.gradients}, {"optimizer", b.optimizer}};
  };
  j["planned_per_rank"] = bytes(r.planned);
  for (const ModelStateBytes& b : r.measured) j["measured_per_rank"].push_back(bytes(b));
  j["memory_match"] = r.memory_match;
  j["max_err_ratio"] = r.max_err_ratio();
  j["ok"] = r.ok;
  j["failure"] = r.failure;
  j["pass"] = r.pass();
  return j;
}

void write_chart(const std::string& path, const TrainConfig& c, const TrainResult& r) {
  Panel loss;  // assigned, not aggregate-initialized: Panel grows fields
  loss.title = "loss per step";
  loss.x_label = "step";
  loss.y_label = "loss";
  Series p{c.stack.strategy.name() + " (fp32)", {}}, ref32{"reference fp32", {}},
      o64{"oracle fp64", {}};
  Panel ratio;
  ratio.title = "parallel error / rule bound, per step";
  ratio.x_label = "step";
  ratio.y_label = "ratio";
  Series rs{"max over the loss and every parameter", {}};
  for (const TrainStep& s : r.steps) {
    p.points.emplace_back(s.step, s.loss);
    ref32.points.emplace_back(s.step, s.reference_loss);
    o64.points.emplace_back(s.step, s.oracle_loss);
    rs.points.emplace_back(s.step, s.err_ratio);
  }
  loss.series = {p, ref32, o64};
  ratio.series = {rs};
  ratio.hlines = {{1.0, "bound"}};
  if (r.steps.size() > 12) {  // tick every few steps, not every one
    const std::size_t every = (r.steps.size() + 9) / 10;
    for (std::size_t i = 0; i < r.steps.size(); i += every) {
      const double x = r.steps[i].step;
      loss.x_ticks.emplace_back(x, fmt("%g", x));
    }
    ratio.x_ticks = loss.x_ticks;
  }
  write_svg(path, "tspemu train: " + c.stack.strategy.name() + ", " + c.optimizer.to_string(),
            {loss, ratio});
}

}  // namespace

int train_command(const TrainArgs& a, std::ostream& out) {
  if (a.pipeline.pp > 0) {
    if (!a.json_path.empty() || !a.svg_path.empty())
      throw ConfigError("--pp: --json and --svg are not supported yet");
    return train_pipeline_command(a, out);
  }
  check_output_files({{"--json", a.json_path}, {"--svg", a.svg_path}});
  ProblemOptions problem = a.problem;
  const auto weights = load_checkpoint_option(a.checkpoint, problem);  // sets problem.model
  const tsp::cost::Strategy st = parse_strategy(problem);
  const bool whole = !a.layers_only;
  TrainConfig c;
  c.stack = make_stack_config(problem, st, whole);
  c.stack.weights = weights;
  c.whole_model = whole;
  c.steps = a.steps;
  if (a.steps < 1) throw ConfigError("--steps " + std::to_string(a.steps) + ": must be >= 1");
  c.optimizer = a.opt;
  c.optimizer.kind = ref::optimizer_kind_named(a.optimizer);
  // Each step is a checked run's forward and backward (the same stack, reference and oracle) with
  // optimizer state on top: what `run` needs is a lower bound of what a step holds, so the same
  // pre-check refuses a training that cannot fit before anything is allocated.
  require_run_memory(c.stack, whole, "train " + st.name(), available_memory(),
                     stack_world_options(c.stack, st.ranks()).arena_capacity);
  c.corpus = a.data.empty() ? builtin_corpus() : read_corpus(a.data);
  c.corpus_name = a.data.empty() ? "built-in" : a.data;
  TrainResult r;
  {
    ProgressBar bar("train " + st.name(), c.steps, !a.quiet);
    c.on_step = [&bar](int step) { bar.step("step " + std::to_string(step)); };
    r = run_training(c);
  }
  out << "tspemu train: " << st.name() << ", B=" << c.stack.B << ", S=" << c.stack.S << ", model "
      << c.stack.model.to_string() << "\n"
      << "trained: " << r.scope << "\n"
      << "blas: " << ref::describe_blas() << "\n"
      << "bf16 gemm: " << ref::describe_bf16_gemm() << "\n"
      << "weights: "
      << (c.stack.weights ? "the checkpoint in " + a.checkpoint.weights : std::string("seeded"))
      << "\n"
      << "optimizer: " << c.optimizer.to_string() << " (fp32 state); corpus: " << c.corpus_name
      << " (" << c.corpus.size() << " tokens)\n"
      << "rule at every step t, against the fp64 oracle's trajectory from the same float "
         "weights: err(parallel_t) <= "
      << fmt("%g", c.stack.k)
      << " * max over steps s <= t of err(reference fp32_s) + tiny, for the loss (abs) and every "
         "parameter after the update ("
      << (c.optimizer.kind == ref::OptimizerKind::adamw
              ? "the 99% quantile of the element errors: AdamW"
              : "max abs error: SGD")
      << ")\n\n";
  out << fmt("%5s %12s %12s %12s %9s  %s\n", "step", "loss", "ref fp32", "oracle fp64", "err/bnd",
             "worst tensor");
  for (const TrainStep& s : r.steps)
    out << fmt("%5d %12.6f %12.6f %12.6f %9.4f  %s\n", s.step, s.loss, s.reference_loss,
               s.oracle_loss, s.err_ratio, s.worst.c_str());
  out << "\n"
      << fmt("time: %d steps in %.2f s parallel (%.3f s/step); reference fp32 %.2f s\n",
             static_cast<int>(r.steps.size()), r.seconds,
             r.seconds / static_cast<double>(std::max<std::size_t>(r.steps.size(), 1)),
             r.reference_seconds);
  if (!r.steps.empty())
    out << fmt("final loss: parallel %.6f, reference fp32 %.6f, oracle fp64 %.6f\n",
               r.steps.back().loss, r.steps.back().reference_loss, r.steps.back().oracle_loss);
  out << fmt("worst per-step error ratio (parallel err / bound): %.4f\n\n", r.max_err_ratio());
  out << "model-state bytes per rank after the first step, measured (arena) vs planner:\n"
      << fmt("%-6s %14s %14s %14s\n", "rank", "weights", "gradients", "optimizer");
  out << fmt("%-6s %14llu %14llu %14llu\n", "model",
             static_cast<unsigned long long>(r.planned.weights),
             static_cast<unsigned long long>(r.planned.gradients),
             static_cast<unsigned long long>(r.planned.optimizer));
  for (std::size_t i = 0; i < r.measured.size(); ++i)
    out << fmt("%-6zu %14llu %14llu %14llu%s\n", i,
               static_cast<unsigned long long>(r.measured[i].weights),
               static_cast<unsigned long long>(r.measured[i].gradients),
               static_cast<unsigned long long>(r.measured[i].optimizer),
               r.measured[i] == r.planned ? "" : "  differs");
  if (!r.ok) out << "\nSTOPPED: " << r.failure << "\n";
  out << "\nverdict: "
      << (r.pass() ? "PASS (every step within the rule; model-state bytes as planned)"
          : !r.ok  ? "FAIL (a step broke the rule)"
                   : "FAIL (model-state bytes differ from the planner)")
      << "\n";
  if (!a.json_path.empty()) write_json(a.json_path, train_json(c, r));
  if (!a.svg_path.empty()) write_chart(a.svg_path, c, r);
  save_checkpoint_option(a.checkpoint, r.trained, out);
  return r.pass() ? 0 : 1;
}

}  // namespace tspemu::app
