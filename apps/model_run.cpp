#include "model_run.hpp"

#include <chrono>
#include <random>
#include <stdexcept>

#include "mpi_job.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/barrier.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/strategy.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

namespace {

// The step's batch: seeded tokens, each one's target the next (the last wraps to the first).
struct TokenBatch {
  std::vector<std::int32_t> tokens, targets;
};

TokenBatch seeded_batch(const StackConfig& c) {
  const std::size_t n = static_cast<std::size_t>(c.B) * c.S;
  TokenBatch b{std::vector<std::int32_t>(n), std::vector<std::int32_t>(n)};
  std::mt19937_64 gen(c.seed + 1);
  for (std::size_t i = 0; i < n; ++i)
    b.tokens[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(c.model.vocab));
  for (std::size_t i = 0; i + 1 < n; ++i) b.targets[i] = b.tokens[i + 1];
  b.targets[n - 1] = b.tokens[0];
  return b;
}

// The parallel step on every rank: out's per-rank measures and time, the gathered gradients gt;
// returns rank 0's loss.
double run_parallel(const StackConfig& c, const tsp::LayerProblem& problem,
                    const ref::ModelWeights<float>& w32, const TokenBatch& batch, StackResult& out,
                    ref::ModelWeights<float>& gt) {
  const tsp::StrategyBlocks& blocks = tsp::strategy_blocks(c.strategy.scheme);
  double loss_parallel = 0;
  World world(stack_world_options(c, c.strategy.ranks()));
  world.run([&](Rank& rank) {
    const int p = rank.id();
    const auto model = blocks.make_model(rank, problem, c.strategy, w32);
    rank.arena().reset_peaks();
    StepClock clock(rank, out);
    clock.start();
    const double loss = model->forward(batch.tokens, batch.targets);
    if (p == 0 && c.on_step) c.on_step();
    clock.forward_done();
    if (p == c.fail_rank) throw std::runtime_error("injected failure (--inject-failure-rank)");
    model->backward();
    if (p == 0 && c.on_step) c.on_step();
    clock.backward_done();
    if (p == 0) loss_parallel = loss;
    model->write_gradients(gt);
  });
  share_measures(out);
  finish_debugging(c, world, out);
  return loss_parallel;
}

// Traffic against L × the cost model's layer plus its vocabulary part; weights and gradients
// against L × the dry layer plus the model's own tensors.
void check_model_costs(const StackConfig& c, const tsp::LayerProblem& problem, StackResult& out) {
  const cost::ModelShape ms = cost::ModelShape::from(c.model, c.B, c.S);
  const auto L = static_cast<std::uint64_t>(c.model.n_layers);
  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  const cost::CostOptions opt = tsp::cost_options(problem.tsp);
  check_traffic(out, [&](int r) {
    const cost::LayerTraffic t = cost::layer_traffic(ms, c.strategy, es, opt, r);
    const cost::VocabTraffic v = cost::vocab_traffic(ms, c.strategy, es, r);
    return std::pair{t.forward * L + v.forward, t.backward * L + v.backward};
  });
  out.layer_model = tsp::measure_layer(c.model, c.B, c.S, c.strategy,
                                       {.head_buckets = problem.tsp.head_buckets,
                                        .keep_attention_shards = problem.tsp.keep_attention_shards,
                                        .keep_kv = problem.tsp.keep_kv,
                                        .overlap = problem.tsp.overlap})
                        .ranks[0];
  // The model's own tensors, each charged in 64-byte units: embedding and (untied) LM head
  // shards, final norm — and a gradient of each.
  auto charged = [](std::uint64_t bytes) { return (bytes + 63) / 64 * 64; };
  const std::uint64_t shard =
      static_cast<std::uint64_t>(c.model.vocab / cost::vocab_shards(c.strategy)) * c.model.hidden *
      4;
  check_memory(out, c.model.n_layers,
               (c.model.tie_embeddings ? 1 : 2) * charged(shard) +
                   charged(static_cast<std::uint64_t>(c.model.hidden) * 4));
}

// The reference step in float and the oracle's in double on the same float weights; judges the
// loss and every parameter gradient.
void judge_model(const StackConfig& c, const ref::ModelWeights<float>& w32,
                 const TokenBatch& tokens, double loss_parallel, const ref::ModelWeights<float>& gt,
                 StackResult& out) {
  ref::Batch batch{c.B, c.S, tokens.tokens, tokens.targets, {}};
  const auto t0 = std::chrono::steady_clock::now();
  ref::ModelCache<float> c32;
  ref::ModelWeights<float> g32;
  const double loss32 = ref::model_forward(w32, batch, c32);
  ref::model_backward(w32, batch, c32, g32);
  out.reference_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (c.on_step) c.on_step();
  const auto wo = ref::convert_weights<double>(w32);  // the oracle sees the float weights exactly
  ref::ModelCache<double> c64;
  ref::ModelWeights<double> g64;
  const double loss64 = ref::model_forward(wo, batch, c64);
  ref::model_backward(wo, batch, c64, g64);
  if (c.on_step) c.on_step();

  const std::vector<float> lt{static_cast<float>(loss_parallel)}, lr{static_cast<float>(loss32)};
  const std::vector<double> lo{loss64};
  judge(out, "loss", lt, lr, lo, c.k);
  const auto pc = ref::parameters(gt);
  const auto pr = ref::parameters(static_cast<const ref::ModelWeights<float>&>(g32));
  const auto po = ref::parameters(static_cast<const ref::ModelWeights<double>&>(g64));
  for (std::size_t i = 0; i < pc.size(); ++i)
    judge(out, "grad " + pc[i].name, *pc[i].data, *pr[i].data, *po[i].data, c.k);
}

}  // namespace

StackResult run_model(const StackConfig& c) {
  validate_stack(c);
  const tsp::RuleOptions rules{
      .tsp_layout = c.layout, .head_buckets = c.head_buckets, .whole_model = true};
  if (const auto v = tsp::violation(cost::ModelShape::from(c.model, c.B, c.S), c.strategy, rules))
    throw std::invalid_argument(c.strategy.name() + ": " + v->message);
  const tsp::LayerProblem problem = layer_problem(c);
  const auto w32 = initial_weights(c);
  const TokenBatch batch = seeded_batch(c);

  StackResult out;
  out.scope = "whole model: embedding, " + std::to_string(c.model.n_layers) + " " +
              tsp::strategy_info(c.strategy.scheme).title +
              " layers, final norm, LM head and loss; forward + backward";
  out.ranks.resize(static_cast<std::size_t>(c.strategy.ranks()));
  auto gt = ref::ModelWeights<float>::zeros(c.model);
  const double loss_parallel = run_parallel(c, problem, w32, batch, out, gt);
  out.tokens_per_s = static_cast<double>(c.B) * c.S / out.seconds;
  check_model_costs(c, problem, out);
  if (!c.check) return out;
  // Under mpirun: process 0 judges every gradient, with the shards other processes' ranks wrote
  // (rank 0, hence process 0, has the loss).
  for (const auto& g : ref::parameters(gt)) merge_written(*g.data);
  if (!mpi_job().prints()) return out;
  judge_model(c, w32, batch, loss_parallel, gt, out);
  return out;
}

}  // namespace tspemu::app
