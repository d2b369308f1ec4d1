#include "train_run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>

#include "stack_report.hpp"
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
    std::vector<std::int64_t> pos(static_cast<std::size_t>(S));
    for (int i = 0; i < S; ++i) pos[static_cast<std::size_t>(i)] = i;
    const std::size_t L = w_.layers.size();
    std::vector<std::vector<T>> act(L + 1);
    act[0] = embedded(embed_, b.tokens, C);
    std::vector<ref::LayerCache<T>> caches(L);
    for (std::size_t l = 0; l < L; ++l) {
      act[l + 1].resize(act[0].size());
      ref::layer_forward(m, w_.layers[l], act[l].data(), act[l + 1].data(), pos.data(), B, S,
                         caches[l]);
    }
    const std::vector<T> target = embedded(embed_, b.targets, C);
    std::vector<T> dy(target.size()), dx(target.size());
    const double loss = mse_gradient(act[L].data(), target.data(), dy.data(), dy.size(),
                                     static_cast<double>(B) * S);
    std::vector<ref::LayerWeights<T>> grads(L, ref::LayerWeights<T>::zeros(m));
    for (std::size_t l = L; l-- > 0;) {
      ref::layer_backward(m, w_.layers[l], act[l].data(), dy.data(), dx.data(), pos.data(), B, S,
                          caches[l], grads[l]);
      std::swap(dy, dx);
    }
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
  const int n = sc.strategy.ranks(), B = sc.B, S = sc.S, C = m.hidden, L = m.n_layers;
  const auto w32 = initial_weights(sc);
  ReferenceTrainer<float> r32(c, w32, whole);
  ReferenceTrainer<double> o64(c, ref::convert_weights<double>(w32), whole);
  const tsp::StrategyInfo& info = tsp::strategy_info(sc.strategy.scheme);
  const tsp::StrategyBlocks& blocks = tsp::strategy_blocks(sc.strategy.scheme);
  const tsp::LayerProblem problem = layer_problem(sc);

  TrainResult out;
  out.scope = whole ? "whole model (embedding, " + std::to_string(L) + " " + info.title +
                          " layers, LM head, next-token cross-entropy)"
                    : "layer stack (" + std::to_string(L) +
                          " layers; input: frozen embedding of each token; loss: mean squared "
                          "distance to the frozen embedding of the next token)";
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
    const auto t0 = std::chrono::steady_clock::now();
    world.run([&](Rank& rank) {
      const int p = rank.id();
      RankTrainer& rt = ranks[static_cast<std::size_t>(p)];
      std::vector<tsp::ParameterShard> params;
      if (whole) {
        if (!rt.model) rt.model = blocks.make_model(rank, problem, sc.strategy, w32);
        const double loss = rt.model->forward(batch.tokens, batch.targets);
        rt.model->backward();
        if (p == 0) step.loss = loss;
        if (!rt.opt) params = rt.model->parameters();
      } else {
        if (rt.layers.empty()) {
          rt.place = blocks.place(problem, sc.strategy, p);
          for (const auto& lw : w32.layers)
            rt.layers.push_back(blocks.make_layer(rank, problem, sc.strategy, lw));
        }
        Arena& a = rank.arena();
        const std::size_t rows = rt.place.positions.size();
        const std::size_t local = static_cast<std::size_t>(B) * rows * C;
        auto each_row = [&](auto fn) {  // fn(local offset, global token index)
          for (int b = 0; b < B; ++b)
            for (std::size_t i = 0; i < rows; ++i)
              fn((static_cast<std::size_t>(b) * rows + i) * C,
                 static_cast<std::size_t>(b) * S + static_cast<std::size_t>(rt.place.positions[i]));
        };
        std::vector<Buffer<float>> act;
        for (int l = 0; l <= L; ++l) act.push_back(a.allocate<float>(local, Category::activations));
        auto target = a.allocate<float>(local, Category::workspace);
        auto g = a.allocate<float>(local, Category::workspace);
        auto g_next = a.allocate<float>(local, Category::workspace);
        each_row([&](std::size_t lo, std::size_t token) {
          const auto in = static_cast<std::size_t>(batch.tokens[token]) * C;
          const auto next = static_cast<std::size_t>(batch.targets[token]) * C;
          std::memcpy(act[0].data() + lo, w32.embed.data() + in, C * sizeof(float));
          std::memcpy(target.data() + lo, w32.embed.data() + next, C * sizeof(float));
        });
        for (std::size_t l = 0; l < rt.layers.size(); ++l)
          rt.layers[l]->forward(act[l].data(), act[l + 1].data());
        mse_gradient(act.back().data(), target.data(), g.data(), local, static_cast<double>(B) * S);
        for (std::size_t l = rt.layers.size(); l-- > 0;) {
          rt.layers[l]->backward(act[l].data(), g.data(), g_next.data());
          std::swap(g, g_next);
        }
        if (rt.place.reports_tokens)
          each_row([&](std::size_t lo, std::size_t token) {
            std::memcpy(got_y.data() + token * C, act.back().data() + lo, C * sizeof(float));
          });
        if (!rt.opt)
          for (auto& layer : rt.layers) {
            const auto lp = layer->parameters();
            params.insert(params.end(), lp.begin(), lp.end());
          }
      }
      if (!rt.opt)
        rt.opt = std::make_unique<tsp::ShardedOptimizer>(rank, c.optimizer, std::move(params));
      rt.opt->step();
      if (c.after_update) c.after_update(step.step, p, rt.opt->shards());
      const ArenaStats st = rank.arena().stats();
      rt.bytes = {category_bytes(st, Category::weights), category_bytes(st, Category::gradients),
                  category_bytes(st, Category::optimizer)};
      // Gather the updated weights: disjoint elements per rank (one replica per shard, rank 0
      // the norms).
      if (whole) {
        rt.model->write_weights(got);
        return;
      }
      for (std::size_t l = 0; l < rt.layers.size(); ++l) {
        const auto ps = rt.layers[l]->parameters();
        if (rt.place.reports_shard) {
          tsp::unpack_attention_shard(ps[0].weight.data(), rt.place.shard_shape, rt.place.shard,
                                      got.layers[l]);
          tsp::unpack_mlp_shard(ps[2].weight.data(), rt.place.shard_shape, rt.place.shard,
                                got.layers[l]);
        }
        if (p == 0) {
          std::ranges::copy(ps[1].weight, got.layers[l].input_norm.begin());
          std::ranges::copy(ps[3].weight, got.layers[l].post_norm.begin());
        }
      }
    });
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

    judge_step(out, step, envelope, "loss", std::vector<float>{static_cast<float>(step.loss)},
               std::vector<float>{static_cast<float>(step.reference_loss)},
               std::vector<double>{step.oracle_loss}, sc.k, false);
    const bool adam = c.optimizer.kind == ref::OptimizerKind::adamw;
    const auto pg = ref::parameters(static_cast<const ref::ModelWeights<float>&>(got));
    const auto pr = ref::parameters(r32.weights());
    const auto po = ref::parameters(o64.weights());
    for (std::size_t i = 0; i < pg.size(); ++i) {
      // The stack trains only the layers (the embedding and head are frozen or unused).
      if (!whole && !pg[i].name.starts_with("model.layers.")) continue;
      judge_step(out, step, envelope, pg[i].name, *pg[i].data, *pr[i].data, *po[i].data, sc.k,
                 adam);
    }
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
