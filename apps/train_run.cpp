#include "train_run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>

#include "stack_report.hpp"
#include "tspemu/check/token_shards.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/sharded_optimizer.hpp"
#include "tspemu/tsp/strategy.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One step's batch: [B, S] tokens and next-token targets.
struct StepBatch {
  std::vector<std::int32_t> tokens, targets;
};

StepBatch batch_at(const TrainConfig& c, int step) {
  const int B = c.stack.B, S = c.stack.S;
  const std::size_t span = c.corpus.size() - static_cast<std::size_t>(S);
  StepBatch b;
  for (int s = 0; s < B; ++s) {
    const std::size_t first =
        (static_cast<std::size_t>(step) * B + static_cast<std::size_t>(s)) * S % span;
    b.tokens.insert(b.tokens.end(), c.corpus.begin() + static_cast<std::ptrdiff_t>(first),
                    c.corpus.begin() + static_cast<std::ptrdiff_t>(first + S));
    b.targets.insert(b.targets.end(), c.corpus.begin() + static_cast<std::ptrdiff_t>(first + 1),
                     c.corpus.begin() + static_cast<std::ptrdiff_t>(first + S + 1));
  }
  return b;
}

// The stand-in objective of the layer stack: inputs E[token], targets E[next token], for the
// [B·S] tokens of a batch, from the frozen embedding E [V, C].
template <class T>
std::vector<T> embedded(const std::vector<T>& E, const std::vector<std::int32_t>& ids, int C) {
  std::vector<T> out(ids.size() * static_cast<std::size_t>(C));
  for (std::size_t t = 0; t < ids.size(); ++t)
    std::copy_n(E.begin() + static_cast<std::ptrdiff_t>(ids[t]) * C, C,
                out.begin() + static_cast<std::ptrdiff_t>(t) * C);
  return out;
}

// dy = (y - target) / N element-wise (in T, as every rank computes it on its rows); returns the
// loss (1/2N)·Σ (y - target)² in double.
template <class T>
double mse_gradient(const T* y, const T* target, T* dy, std::size_t n, double N) {
  const T inv_n = static_cast<T>(1.0 / N);
  double loss = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const T d = y[i] - target[i];
    dy[i] = d * inv_n;
    loss += static_cast<double>(d) * static_cast<double>(d);
  }
  return loss / (2 * N);
}

// The reference's side of a run in T: whole model or layer stack, with its optimizer.
template <class T>
class ReferenceTrainer {
 public:
  ReferenceTrainer(const TrainConfig& c, const ref::ModelWeights<T>& w, bool whole)
      : c_(c), w_(w), embed_(w.embed), whole_(whole), opt_(c.optimizer) {}

  // One step on the batch: returns the loss before the update.
  double step(const StepBatch& b) {
    const ref::ModelConfig& m = c_.stack.model;
    const int B = c_.stack.B, S = c_.stack.S, C = m.hidden;
    if (whole_) {
      const ref::Batch batch{B, S, b.tokens, b.targets, {}};
      ref::ModelCache<T> cache;
      auto grads = ref::ModelWeights<T>::zeros(m);
      const double loss = ref::model_forward(w_, batch, cache);
      ref::model_backward(w_, batch, cache, grads);
      opt_.step(w_, grads);
      return loss;
    }
    ref::StackCache<T> cache;
    const std::vector<T>& y =
        ref::layer_stack_forward(m, w_.layers, embedded(embed_, b.tokens, C), B, S, cache);
    const std::vector<T> target = embedded(embed_, b.targets, C);
    std::vector<T> dy(target.size()), dx;
    const double loss =
        mse_gradient(y.data(), target.data(), dy.data(), dy.size(), static_cast<double>(B) * S);
    std::vector<ref::LayerWeights<T>> grads;
    ref::layer_stack_backward(m, w_.layers, dy, B, S, cache, dx, grads);
    opt_.step(w_.layers, grads);
    return loss;
  }
  const ref::ModelWeights<T>& weights() const { return w_; }

 private:
  const TrainConfig& c_;
  ref::ModelWeights<T> w_;
  const std::vector<T> embed_;  // frozen, the layer stack's input and target (stack only)
  bool whole_;
  ref::Optimizer<T> opt_;
};

// One rank's persistent part of the parallel run.
struct RankTrainer {
  std::unique_ptr<tsp::RankModel> model;  // whole model
  tsp::RankPlacement place;               // layer stack
  std::vector<std::unique_ptr<tsp::RankLayer>> layers;
  std::unique_ptr<tsp::ShardedOptimizer> opt;
  ModelStateBytes bytes;
};

std::uint64_t category_bytes(const ArenaStats& s, Category c) {
  return s.category_current[static_cast<std::size_t>(c)];
}

// The planner's per-rank model states (see the header): cost::parameter_state_bytes_per_rank
// for tspemu's fp32 run (fp32 weights and gradients, AdamW's fp32 m and v, no master copy; SGD
// without moments); the layer stack has no vocabulary (vocab 0).
ModelStateBytes planned_state(const TrainConfig& c, bool whole) {
  const StackConfig& s = c.stack;
  cost::ModelShape ms = cost::ModelShape::from(s.model, s.B, s.S);
  if (!whole) ms.vocab = 0;
  cost::PrecisionModel p = cost::PrecisionModel::fp32_emulator();
  p.moments = c.optimizer.state_per_param() * 4.0;
  const cost::ParameterState st = cost::parameter_state_bytes_per_rank(s.strategy, ms, p);
  return {static_cast<std::uint64_t>(st.weights), static_cast<std::uint64_t>(st.gradients),
          static_cast<std::uint64_t>(st.optimizer())};
}

void validate(const TrainConfig& c, bool whole) {
  validate_stack(c.stack);
  const tsp::RuleOptions rules{
      .tsp_layout = c.stack.layout, .head_buckets = c.stack.head_buckets, .whole_model = whole};
  if (const auto v = tsp::violation(cost::ModelShape::from(c.stack.model, c.stack.B, c.stack.S),
                                    c.stack.strategy, rules))
    throw std::invalid_argument(c.stack.strategy.name() + ": " + v->message);
  c.optimizer.validate();
  if (c.steps < 1)
    throw std::invalid_argument("steps=" + std::to_string(c.steps) + " must be >= 1");
  const std::size_t need = static_cast<std::size_t>(c.stack.S) + 1;
  if (c.corpus.size() < need)
    throw std::invalid_argument("corpus " + c.corpus_name + ": " + std::to_string(c.corpus.size()) +
                                " tokens, fewer than S + 1 = " + std::to_string(need));
  for (std::size_t i = 0; i < c.corpus.size(); ++i)
    if (c.corpus[i] < 0 || c.corpus[i] >= c.stack.model.vocab)
      throw std::invalid_argument("corpus " + c.corpus_name + ": token " + std::to_string(i) +
                                  " is " + std::to_string(c.corpus[i]) + ", outside [0, vocab=" +
                                  std::to_string(c.stack.model.vocab) + ")");
}

// Judges one tensor of a step against the envelope of the reference's error (the largest over
// the steps so far, kept per tensor in `envelope`); records the worst ratio and the first
// failure.
void judge_step(TrainResult& out, TrainStep& step, std::map<std::string, double>& envelope,
                const std::string& name, std::span<const float> parallel,
                std::span<const float> reference, std::span<const double> oracle, double k,
                bool quantile) {
  const ref::ErrorStats cs = ref::measure(parallel, oracle);
  const ref::ErrorStats rs = ref::measure(reference, oracle);
  const double err = quantile ? ref::quantile_error(parallel, oracle, 0.99) : cs.max_abs;
  const double ref_err = quantile ? ref::quantile_error(reference, oracle, 0.99) : rs.max_abs;
  double& env = envelope[name];
  env = std::max(env, ref_err);
  const double tiny = ref::default_tiny(oracle);
  const double bound = k * env + tiny;
  const bool ok = cs.finite && rs.finite && err <= bound;
  const double ratio = bound > 0 ? err / bound : 0.0;
  const double r = std::isfinite(ratio) ? ratio : HUGE_VAL;
  if (r > step.err_ratio || step.worst.empty()) {
    step.err_ratio = std::max(step.err_ratio, r);
    step.worst = name;
  }
  if (ok || !out.ok) return;
  out.ok = false;
  const char* stat = quantile ? "q0.99" : "max";
  out.failure = fmt(
      "step %d: %s breaks the rule err(parallel) <= k * max over steps of err(reference) + tiny: "
      "%s err(parallel) %.3e > bound %g * %.3e + %.3e = %.3e (this step's reference err %.3e); "
      "parallel %s",
      step.step, name.c_str(), stat, err, k, env, tiny, bound, ref_err, cs.to_string().c_str());
}

// What a step's ranks share: the run's fixed inputs and where they gather their results.
struct StepContext {
  const TrainConfig& c;
  const tsp::StrategyBlocks& blocks;
  const tsp::LayerProblem& problem;
  const ref::ModelWeights<float>& w32;
  const StepBatch& batch;
  TrainStep& step;
  ref::ModelWeights<float>& got;  // the updated weights, gathered
  std::vector<float>& got_y;      // the layer stack's output [B, S, C], gathered
};

// One rank's forward and backward of the layer stack on the stand-in objective; gathers its
// output rows (the reporting replica). Returns the layers' parameters on the first step (for
// the optimizer), else nothing.
std::vector<tsp::ParameterShard> stack_pass(const StepContext& x, Rank& rank, RankTrainer& rt) {
  const StackConfig& sc = x.c.stack;
  const int p = rank.id(), B = sc.B, S = sc.S, C = sc.model.hidden, L = sc.model.n_layers;
  if (rt.layers.empty()) {
    rt.place = x.blocks.place(x.problem, sc.strategy, p);
    for (const auto& lw : x.w32.layers)
      rt.layers.push_back(x.blocks.make_layer(rank, x.problem, sc.strategy, lw));
  }
  Arena& a = rank.arena();
  const check::TokenShard rows{0, B, rt.place.positions};
  const std::size_t local = static_cast<std::size_t>(B) * rows.positions.size() * C;
  std::vector<Buffer<float>> act;
  for (int l = 0; l <= L; ++l) act.push_back(a.allocate<float>(local, Category::activations));
  auto target = a.allocate<float>(local, Category::workspace);
  auto g = a.allocate<float>(local, Category::workspace);
  auto g_next = a.allocate<float>(local, Category::workspace);
  check::for_each_row(rows, S, C, [&](std::size_t lo, std::size_t at) {
    const std::size_t token = at / static_cast<std::size_t>(C);
    const auto in = static_cast<std::size_t>(x.batch.tokens[token]) * C;
    const auto next = static_cast<std::size_t>(x.batch.targets[token]) * C;
    std::memcpy(act[0].data() + lo, x.w32.embed.data() + in, C * sizeof(float));
    std::memcpy(target.data() + lo, x.w32.embed.data() + next, C * sizeof(float));
  });
  for (std::size_t l = 0; l < rt.layers.size(); ++l)
    rt.layers[l]->forward(act[l].data(), act[l + 1].data());
  mse_gradient(act.back().data(), target.data(), g.data(), local, static_cast<double>(B) * S);
  for (std::size_t l = rt.layers.size(); l-- > 0;) {
    rt.layers[l]->backward(act[l].data(), g.data(), g_next.data());
    std::swap(g, g_next);
  }
  if (rt.place.reports_tokens) check::gather_rows(rows, S, C, act.back().data(), x.got_y.data());
  std::vector<tsp::ParameterShard> params;
  if (!rt.opt)
    for (auto& layer : rt.layers) {
      const auto lp = layer->parameters();
      params.insert(params.end(), lp.begin(), lp.end());
    }
  return params;
}

// Gathers a rank's updated layer weights: disjoint elements per rank (one replica per shard,
// rank 0 the norms).
void gather_stack_weights(const RankTrainer& rt, int p, ref::ModelWeights<float>& got) {
  for (std::size_t l = 0; l < rt.layers.size(); ++l) {
    // parameters(): attention shard, input norm, MLP shard, post norm
    const auto ps = rt.layers[l]->parameters();
    tsp::unpack_layer<float>({ps[0].weight, ps[1].weight, ps[2].weight, ps[3].weight},
                             rt.place.shard_shape, rt.place.shard, rt.place.reports_shard, p == 0,
                             got.layers[l]);
  }
}

// One rank's step: forward, backward, the optimizer's update, its model-state bytes and the
// gathering of its updated weights.
void rank_step(const StepContext& x, Rank& rank, RankTrainer& rt) {
  const int p = rank.id();
  std::vector<tsp::ParameterShard> params;
  if (x.c.whole_model) {
    if (!rt.model) rt.model = x.blocks.make_model(rank, x.problem, x.c.stack.strategy, x.w32);
    const double loss = rt.model->forward(x.batch.tokens, x.batch.targets);
    rt.model->backward();
    if (p == 0) x.step.loss = loss;
    if (!rt.opt) params = rt.model->parameters();
  } else {
    params = stack_pass(x, rank, rt);
  }
  if (!rt.opt)
    rt.opt = std::make_unique<tsp::ShardedOptimizer>(rank, x.c.optimizer, std::move(params));
  rt.opt->step();
  if (x.c.after_update) x.c.after_update(x.step.step, p, rt.opt->shards());
  const ArenaStats st = rank.arena().stats();
  rt.bytes = {category_bytes(st, Category::weights), category_bytes(st, Category::gradients),
              category_bytes(st, Category::optimizer)};
  if (x.c.whole_model)
    rt.model->write_weights(x.got);
  else
    gather_stack_weights(rt, p, x.got);
}

// The step's loss and every trained parameter against the references' (judge_step).
void judge_tensors(const TrainConfig& c, TrainResult& out, TrainStep& step,
                   std::map<std::string, double>& envelope, const ref::ModelWeights<float>& got,
                   const ReferenceTrainer<float>& r32, const ReferenceTrainer<double>& o64) {
  judge_step(out, step, envelope, "loss", std::vector<float>{static_cast<float>(step.loss)},
             std::vector<float>{static_cast<float>(step.reference_loss)},
             std::vector<double>{step.oracle_loss}, c.stack.k, false);
  const bool adam = c.optimizer.kind == ref::OptimizerKind::adamw;
  const auto pg = ref::parameters(got);
  const auto pr = ref::parameters(r32.weights());
  const auto po = ref::parameters(o64.weights());
  for (std::size_t i = 0; i < pg.size(); ++i) {
    // The stack trains only the layers (the embedding and head are frozen or unused).
    if (!c.whole_model && !pg[i].name.starts_with("model.layers.")) continue;
    judge_step(out, step, envelope, pg[i].name, *pg[i].data, *pr[i].data, *po[i].data, c.stack.k,
               adam);
  }
}

std::string train_scope(const TrainConfig& c, const tsp::StrategyInfo& info) {
  const std::string L = std::to_string(c.stack.model.n_layers);
  return c.whole_model ? "whole model (embedding, " + L + " " + info.title +
                             " layers, LM head, next-token cross-entropy)"
                       : "layer stack (" + L +
                             " layers; input: frozen embedding of each token; loss: mean squared "
                             "distance to the frozen embedding of the next token)";
}

}  // namespace

double TrainResult::max_err_ratio() const {
  double r = 0;
  for (const TrainStep& s : steps) r = std::max(r, s.err_ratio);
  return r;
}

TrainResult run_training(const TrainConfig& c) {
  const StackConfig& sc = c.stack;
  const bool whole = c.whole_model;
  validate(c, whole);
  const ref::ModelConfig& m = sc.model;
  const int n = sc.strategy.ranks(), B = sc.B, S = sc.S, C = m.hidden;
  const auto w32 = initial_weights(sc);
  ReferenceTrainer<float> r32(c, w32, whole);
  ReferenceTrainer<double> o64(c, ref::convert_weights<double>(w32), whole);
  const tsp::StrategyInfo& info = tsp::strategy_info(sc.strategy.scheme);
  const tsp::StrategyBlocks& blocks = tsp::strategy_blocks(sc.strategy.scheme);
  const tsp::LayerProblem problem = layer_problem(sc);

  TrainResult out;
  out.scope = train_scope(c, info);
  out.planned = planned_state(c, whole);
  out.measured.resize(static_cast<std::size_t>(n));
  // The world before the ranks' blocks: they hold buffers of its arenas, released first.
  World world(stack_world_options(sc, n));
  std::vector<RankTrainer> ranks(static_cast<std::size_t>(n));
  auto got = ref::ModelWeights<float>::zeros(m);
  std::vector<float> got_y(static_cast<std::size_t>(B) * S * C);

  std::map<std::string, double> envelope;  // per tensor: the reference's largest error so far
  for (int t = 0; t < c.steps && out.ok; ++t) {
    const StepBatch batch = batch_at(c, t);
    TrainStep step;
    step.step = t + 1;
    const StepContext x{c, blocks, problem, w32, batch, step, got, got_y};
    const auto t0 = std::chrono::steady_clock::now();
    world.run([&](Rank& rank) { rank_step(x, rank, ranks[static_cast<std::size_t>(rank.id())]); });
    step.seconds = seconds_since(t0);
    out.seconds += step.seconds;
    if (t == 0) {
      out.memory_match = true;
      for (int r = 0; r < n; ++r) {
        out.measured[static_cast<std::size_t>(r)] = ranks[static_cast<std::size_t>(r)].bytes;
        out.memory_match =
            out.memory_match && ranks[static_cast<std::size_t>(r)].bytes == out.planned;
      }
    }
    if (!whole) {
      // The parallel loss from the gathered output, as the reference computes its own.
      const std::vector<float> target = embedded(w32.embed, batch.targets, C);
      std::vector<float> unused(target.size());
      step.loss = mse_gradient(got_y.data(), target.data(), unused.data(), unused.size(),
                               static_cast<double>(B) * S);
    }
    const auto r0 = std::chrono::steady_clock::now();
    step.reference_loss = r32.step(batch);
    out.reference_seconds += seconds_since(r0);
    step.oracle_loss = o64.step(batch);
    judge_tensors(c, out, step, envelope, got, r32, o64);
    out.steps.push_back(step);
    if (c.on_step) c.on_step(step.step);
  }
  if (!whole) {  // the stack trains only the layers
    got.embed = w32.embed;
    got.final_norm = w32.final_norm;
    got.lm_head = w32.lm_head;
  }
  out.trained = std::move(got);
  return out;
}

}  // namespace tspemu::app
