#include "train_pipeline.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "problem_options.hpp"
#include "progress_bar.hpp"
#include "stack_report.hpp"
#include "train_command.hpp"
#include "tspemu/pipeline/dense_stage.hpp"
#include "tspemu/pipeline/executor.hpp"
#include "tspemu/reference/blas_kernel.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::app {

void add_pipeline_train_options(CLI::App& train, PipelineTrainArgs& a) {
  train.add_option("--pp", a.pp,
                   "pipeline-parallel ranks: train the whole model pipelined over this many "
                   "ranks, each stage the dense reference (0: the --strategy run)");
  train
      .add_option("--microbatches", a.microbatches, "microbatches per step (--pp; divides --batch)")
      ->capture_default_str();
  train.add_option("--schedule", a.schedule, "gpipe, 1f1b, interleaved-1f1b or zb-h1 (--pp)")
      ->capture_default_str();
  train.add_option("--virtual-stages", a.virtual_stages,
                   "stages per rank (--pp; 0: 2 for interleaved-1f1b, else 1)");
}

namespace {

constexpr double kPipelineOracleK = 3.0;  // as tests/tsp: microbatching only regroups sums

struct PipelinePlan {
  pipeline::Schedule schedule;
  int stages = 0;
};

// Every refusal of the command line, before any rank starts.
PipelinePlan validate(const TrainArgs& a) {
  const PipelineTrainArgs& p = a.pipeline;
  const ProblemOptions& o = a.problem;
  if (a.layers_only) throw ConfigError("--pp trains the whole model: drop --layers-only");
  if (!a.checkpoint.weights.empty() || !a.checkpoint.save.empty())
    throw ConfigError("--pp trains seeded weights: --weights and --save are not supported");
  if (a.steps < 1) throw ConfigError("--steps " + std::to_string(a.steps) + ": must be >= 1");
  if (p.pp < 1) throw ConfigError("--pp " + std::to_string(p.pp) + ": must be >= 1");
  o.model.validate();
  pipeline::Kind kind{};
  try {
    kind = pipeline::parse_kind(p.schedule);
  } catch (const std::invalid_argument& e) {
    throw ConfigError("--schedule " + p.schedule + ": " + e.what());
  }
  const int v = p.virtual_stages > 0                       ? p.virtual_stages
                : kind == pipeline::Kind::interleaved_1f1b ? 2
                                                           : 1;
  if (p.pp * v > o.model.n_layers)
    throw ConfigError("--pp " + std::to_string(p.pp) + " x " + std::to_string(v) +
                      " virtual stages = " + std::to_string(p.pp * v) + " stages > --layers " +
                      std::to_string(o.model.n_layers) + ": every stage needs a layer");
  if (p.microbatches < 1 || o.B % p.microbatches != 0)
    throw ConfigError("--microbatches " + std::to_string(p.microbatches) +
                      " does not divide --batch " + std::to_string(o.B));
  const pipeline::ScheduleSpec spec{
      kind, p.pp, p.microbatches, v, {o.B / p.microbatches, o.S, o.model.hidden}};
  if (auto why = pipeline::refusal(spec))
    throw ConfigError("--schedule " + p.schedule + ": " + *why);
  return {pipeline::make_schedule(spec), p.pp * v};
}

struct StepData {
  std::vector<std::int32_t> tokens, targets;
};

StepData batch_at(const std::vector<std::int32_t>& corpus, int B, int S, int step) {
  const std::size_t span = corpus.size() - std::size_t(S);
  StepData b;
  for (int s = 0; s < B; ++s) {
    const std::size_t first =
        (std::size_t(step) * std::size_t(B) + std::size_t(s)) * std::size_t(S) % span;
    const auto at = corpus.begin() + std::ptrdiff_t(first);
    b.tokens.insert(b.tokens.end(), at, at + S);
    b.targets.insert(b.targets.end(), at + 1, at + S + 1);
  }
  return b;
}

// One pipelined step: the microbatches' losses and the assembled gradients.
double pipelined_step(const PipelinePlan& plan, const ref::ModelWeights<float>& w,
                      const ref::Batch& batch, int microbatches, ref::ModelWeights<float>& grads) {
  const pipeline::Schedule& s = plan.schedule;
  World world({.ranks = s.ranks});
  std::vector<std::vector<std::unique_ptr<pipeline::DenseStage<float>>>> held(std::size_t(s.ranks));
  std::vector<double> losses;
  world.run([&](Rank& r) {
    const std::vector<ref::Batch> mbs = pipeline::cut_microbatches(batch, microbatches);
    auto& mine = held[std::size_t(r.id())];
    std::vector<pipeline::Stage<float>*> ptrs;
    for (int k = 0; k < s.stages; ++k) {
      if (s.stage_rank[std::size_t(k)] != r.id()) continue;
      mine.push_back(std::make_unique<pipeline::DenseStage<float>>(
          w, pipeline::stage_span(w.config.n_layers, s.stages, k), mbs[0].B, batch.T, r.arena()));
      ptrs.push_back(mine.back().get());
    }
    pipeline::PipelineOptions opt;
    opt.tied_embeddings = w.config.tie_embeddings;
    pipeline::PipelineStepResult res =
        pipeline::run_pipeline<float>(r, r.comm(), nullptr, s, mbs, ptrs, opt);
    if (!res.losses.empty()) losses = res.losses;
  });
  grads = ref::ModelWeights<float>::zeros(w.config);
  for (auto& rank : held) {
    for (auto& st : rank) st->export_gradients(grads);
  }
  double loss = 0;
  for (double l : losses) loss += l;
  return loss / double(losses.size());
}

struct Judged {
  double loss32 = 0, loss64 = 0, ratio = 0;
  std::string worst, failure;
};

double ratio_of(const ref::Verdict& v) {
  return v.bound > 0 ? v.candidate.max_abs / v.bound : (v.candidate.max_abs > 0 ? 1e300 : 0);
}

Judged judge(const ref::ModelWeights<float>& w, const ref::Batch& batch, double loss,
             const ref::ModelWeights<float>& grads) {
  const auto w64 = ref::convert_weights<double>(w);
  ref::ModelCache<float> c32;
  ref::ModelCache<double> c64;
  ref::ModelWeights<float> g32;
  ref::ModelWeights<double> g64;
  Judged j;
  j.loss32 = ref::model_forward(w, batch, c32);
  j.loss64 = ref::model_forward(w64, batch, c64);
  ref::model_backward(w, batch, c32, g32);
  ref::model_backward(w64, batch, c64, g64);
  auto take = [&j](const ref::Verdict& v, const std::string& name) {
    const double r = ratio_of(v);
    if (r >= j.ratio) {
      j.ratio = r;
      j.worst = name;
    }
    if (!v.ok && j.failure.empty()) j.failure = v.report;
  };
  take(
      ref::check_close("loss", std::vector<float>{float(loss)}, std::vector<float>{float(j.loss32)},
                       std::vector<double>{j.loss64}, kPipelineOracleK),
      "loss");
  const auto cand = ref::parameters(grads);
  const auto r32 = ref::parameters(static_cast<const ref::ModelWeights<float>&>(g32));
  const auto o64 = ref::parameters(static_cast<const ref::ModelWeights<double>&>(g64));
  for (std::size_t i = 0; i < cand.size(); ++i)
    take(
        ref::check_close(cand[i].name, *cand[i].data, *r32[i].data, *o64[i].data, kPipelineOracleK),
        cand[i].name);
  return j;
}

}  // namespace

int train_pipeline_command(const TrainArgs& a, std::ostream& out) {
  const PipelinePlan plan = validate(a);
  const ProblemOptions& o = a.problem;
  ref::OptimizerConfig oc = a.opt;
  oc.kind = ref::optimizer_kind_named(a.optimizer);
  const std::vector<std::int32_t> corpus = a.data.empty() ? builtin_corpus() : read_corpus(a.data);
  if (corpus.size() < std::size_t(o.S) + 1)
    throw ConfigError("the corpus has " + std::to_string(corpus.size()) +
                      " tokens, fewer than S + 1 = " + std::to_string(o.S + 1));
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    if (corpus[i] < 0 || corpus[i] >= o.model.vocab)
      throw ConfigError("corpus token " + std::to_string(i) + " = " + std::to_string(corpus[i]) +
                        " outside --vocab " + std::to_string(o.model.vocab));
  }
  ref::ModelWeights<float> w = ref::init_weights<float>(o.model, o.seed);
  ref::Optimizer<float> opt(oc);
  out << "tspemu train: pipeline " << plan.schedule.name << ", pp=" << a.pipeline.pp
      << ", stages=" << plan.stages << ", microbatches=" << a.pipeline.microbatches << ", B=" << o.B
      << ", S=" << o.S << ", model " << o.model.to_string() << "\n"
      << "stages: the dense reference on one rank each (--strategy does not apply)\n"
      << "blas: " << ref::describe_blas() << "\n"
      << "optimizer: " << oc.to_string() << " (fp32)\n"
      << "rule at every step, at the weights the pipeline reached: err(pipelined vs fp64 oracle) "
         "<= "
      << fmt("%g", kPipelineOracleK)
      << " * err(full-batch reference fp32 vs oracle) + tiny, for the loss and every gradient\n\n"
      << fmt("%5s %12s %12s %12s %9s  %s\n", "step", "loss", "ref fp32", "oracle fp64", "err/bnd",
             "worst tensor");
  std::string failure;
  {
    ProgressBar bar("train pipeline", a.steps, !a.quiet);
    for (int t = 0; t < a.steps && failure.empty(); ++t) {
      const StepData d = batch_at(corpus, o.B, o.S, t);
      const ref::Batch batch{o.B, o.S, d.tokens, d.targets, {}};
      ref::ModelWeights<float> grads;
      const double loss = pipelined_step(plan, w, batch, a.pipeline.microbatches, grads);
      const Judged j = judge(w, batch, loss, grads);
      out << fmt("%5d %12.6f %12.6f %12.6f %9.4f  %s\n", t + 1, loss, j.loss32, j.loss64, j.ratio,
                 j.worst.c_str());
      if (!j.failure.empty()) failure = "step " + std::to_string(t + 1) + ": " + j.failure;
      opt.step(w, grads);
      bar.step("step " + std::to_string(t + 1));
    }
  }
  if (!failure.empty()) out << "\nSTOPPED: " << failure << "\n";
  out << "\nverdict: "
      << (failure.empty() ? "PASS (every step within the rule)" : "FAIL (a step broke the rule)")
      << "\n";
  return failure.empty() ? 0 : 1;
}

}  // namespace tspemu::app
