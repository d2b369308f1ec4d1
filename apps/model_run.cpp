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

StackResult run_model(const StackConfig& c) {
  validate_stack(c);
  const cost::ModelShape ms = cost::ModelShape::from(c.model, c.B, c.S);
  const tsp::RuleOptions rules{
      .tsp_layout = c.layout, .head_buckets = c.head_buckets, .whole_model = true};
  if (const auto v = tsp::violation(ms, c.strategy, rules))
    throw std::invalid_argument(c.strategy.name() + ": " + v->message);
  const tsp::StrategyInfo& strategy = tsp::strategy_info(c.strategy.scheme);
  const tsp::LayerProblem problem = layer_problem(c);
  const int n_ranks = c.strategy.ranks(), B = c.B, S = c.S, L = c.model.n_layers;
  const auto w32 = initial_weights(c);
  const std::size_t n = static_cast<std::size_t>(B) * S;
  std::vector<std::int32_t> tokens(n), targets(n);
  std::mt19937_64 gen(c.seed + 1);
  for (std::size_t i = 0; i < n; ++i)
    tokens[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(c.model.vocab));
  for (std::size_t i = 0; i + 1 < n; ++i) targets[i] = tokens[i + 1];
  targets[n - 1] = tokens[0];

  StackResult out;
  out.scope = "whole model: embedding, " + std::to_string(L) + " " + strategy.title +
              " layers, final norm, LM head and loss; forward + backward";
  out.ranks.resize(static_cast<std::size_t>(n_ranks));
  auto gt = ref::ModelWeights<float>::zeros(c.model);
  double loss_parallel = 0;
  World world(stack_world_options(c, n_ranks));
  world.run([&](Rank& rank) {
    const int p = rank.id();
    const auto model =
        tsp::strategy_blocks(c.strategy.scheme).make_model(rank, problem, c.strategy, w32);
    rank.arena().reset_peaks();
    StepClock clock(rank, out);
    clock.start();
    const double loss = model->forward(tokens, targets);
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
  out.tokens_per_s = static_cast<double>(n) / out.seconds;

  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  const cost::CostOptions opt = tsp::cost_options(problem.tsp);
  check_traffic(out, [&](int r) {
    const cost::LayerTraffic t = cost::layer_traffic(ms, c.strategy, es, opt, r);
    const cost::VocabTraffic v = cost::vocab_traffic(ms, c.strategy, es, r);
    return std::pair{t.forward * static_cast<std::uint64_t>(L) + v.forward,
                     t.backward * static_cast<std::uint64_t>(L) + v.backward};
  });
  out.layer_model = tsp::measure_layer(c.model, B, S, c.strategy,
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
  check_memory(out, L,
               (c.model.tie_embeddings ? 1 : 2) * charged(shard) +
                   charged(static_cast<std::uint64_t>(c.model.hidden) * 4));
  if (!c.check) return out;
  // Under mpirun: process 0 judges every gradient, with the shards other processes' ranks wrote
  // (rank 0, hence process 0, has the loss).
  for (const auto& g : ref::parameters(gt)) merge_written(*g.data);
  if (!mpi_job().prints()) return out;

  ref::Batch batch{B, S, tokens, targets, {}};
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
  const auto pc = ref::parameters(static_cast<const ref::ModelWeights<float>&>(gt));
  const auto pr = ref::parameters(static_cast<const ref::ModelWeights<float>&>(g32));
  const auto po = ref::parameters(static_cast<const ref::ModelWeights<double>&>(g64));
  for (std::size_t i = 0; i < pc.size(); ++i)
    judge(out, "grad " + pc[i].name, *pc[i].data, *pr[i].data, *po[i].data, c.k);
  return out;
}

}  // namespace tspemu::app
