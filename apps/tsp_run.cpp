#include "tsp_run.hpp"

#include <chrono>
#include <random>
#include <stdexcept>

#include "mpi_job.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/barrier.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/tsp_model.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

VocabTraffic vocab_traffic(const ref::ModelConfig& m, int D, int rank) {
  const std::uint64_t shard = static_cast<std::uint64_t>(m.vocab / D) * m.hidden * 4;
  const std::uint64_t others = static_cast<std::uint64_t>(D - 1);
  // D calls rooted at each rank in turn: this rank is the root of one of them.
  auto broadcasts = [&](cost::Traffic& t) {
    t.add(CollectiveKind::broadcast, 1, others * shard, 0);
    t.add(CollectiveKind::broadcast, others, 0, shard);
  };
  auto reduces = [&](cost::Traffic& t) {
    t.add(CollectiveKind::reduce, 1, 0, others * shard);
    t.add(CollectiveKind::reduce, others, shard, 0);
  };
  VocabTraffic v;
  broadcasts(v.forward);  // embedding
  broadcasts(v.forward);  // LM head
  const std::uint64_t loss = cost::all_reduce_bytes(1, D, rank, 8);
  v.forward.add(CollectiveKind::all_reduce, 1, loss, loss);
  broadcasts(v.backward);  // LM head again
  reduces(v.backward);     // its gradient
  const std::uint64_t norm =
      cost::all_reduce_bytes(static_cast<std::uint64_t>(m.hidden), D, rank, 4);
  v.backward.add(CollectiveKind::all_reduce, 1, norm, norm);
  reduces(v.backward);  // embedding gradient
  return v;
}

StackResult run_tsp_model(const StackConfig& c) {
  const tsp::TspShape s = tsp_shape(c);
  s.validate_whole_model();
  const int D = s.D, B = s.B, S = s.S, L = s.model.n_layers;
  const auto w32 = initial_weights(c);
  const std::size_t n = static_cast<std::size_t>(B) * S;
  std::vector<std::int32_t> tokens(n), targets(n);
  std::mt19937_64 gen(c.seed + 1);
  for (std::size_t i = 0; i < n; ++i)
    tokens[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
  for (std::size_t i = 0; i + 1 < n; ++i) targets[i] = tokens[i + 1];
  targets[n - 1] = tokens[0];

  StackResult out;
  out.scope = "whole model: embedding, " + std::to_string(L) +
              " TSP layers, final norm, LM head and loss; forward + backward";
  out.ranks.resize(static_cast<std::size_t>(D));
  auto gt = ref::ModelWeights<float>::zeros(s.model);
  double loss_tsp = 0;
  const tsp::SequenceLayout layout = s.layout();
  World world(stack_world_options(c, D));
  world.run([&](Rank& rank) {
    const int p = rank.id();
    std::vector<std::int32_t> tl(static_cast<std::size_t>(B) * s.Tl()), yl(tl.size());
    layout.scatter(tokens.data(), tl.data(), p, B, 1);
    layout.scatter(targets.data(), yl.data(), p, B, 1);
    tsp::TspModel model(rank, s, w32);
    rank.arena().reset_peaks();
    StepClock clock(rank, out);
    clock.start();
    const double loss = model.forward(tl.data(), yl.data());
    if (p == 0 && c.on_step) c.on_step();
    clock.forward_done();
    if (p == c.fail_rank) throw std::runtime_error("injected failure (--inject-failure-rank)");
    model.backward();
    if (p == 0 && c.on_step) c.on_step();
    clock.backward_done();
    if (p == 0) loss_tsp = loss;
    model.write_gradients(gt);
  });
  share_measures(out);
  finish_debugging(c, world, out);
  out.tokens_per_s = static_cast<double>(n) / out.seconds;

  const cost::ModelShape ms = cost::ModelShape::from(s.model, B, S);
  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  const cost::CostOptions opt = cost::CostOptions::from(s.options);
  check_traffic(out, [&](int r) {
    const cost::LayerTraffic t = cost::layer_traffic(ms, c.strategy, es, opt, r);
    const VocabTraffic v = vocab_traffic(s.model, D, r);
    return std::pair{scaled(t.forward, static_cast<std::uint64_t>(L), v.forward),
                     scaled(t.backward, static_cast<std::uint64_t>(L), v.backward)};
  });
  out.layer_model = tsp::measure_layer(s.model, B, S, c.strategy,
                                       {.head_buckets = s.options.head_buckets,
                                        .keep_attention_shards = s.options.keep_attention_shards,
                                        .keep_kv = s.options.keep_kv,
                                        .overlap = s.options.overlap})
                        .ranks[0];
  // TspModel's own tensors, each charged in 64-byte units: embedding and (untied) LM head shards,
  // final norm — and a gradient of each.
  auto charged = [](std::uint64_t bytes) { return (bytes + 63) / 64 * 64; };
  const std::uint64_t shard = static_cast<std::uint64_t>(s.model.vocab / D) * s.model.hidden * 4;
  check_memory(out, L,
               (s.model.tie_embeddings ? 1 : 2) * charged(shard) +
                   charged(static_cast<std::uint64_t>(s.model.hidden) * 4));
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

  const std::vector<float> lt{static_cast<float>(loss_tsp)}, lr{static_cast<float>(loss32)};
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
