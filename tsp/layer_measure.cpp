#include "tspemu/tsp/layer_measure.hpp"

#include <chrono>
#include <memory>
#include <utility>

#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/strategy.hpp"

namespace tspemu::tsp {

namespace {

// Records the blocks' bytes after construction, then runs the steps as the header says.
class StepRecorder {
 public:
  StepRecorder(Rank& rank, RankLayerMeasure& out) : rank_(rank), out_(out) {
    for (std::size_t c = 0; c < kCategoryCount; ++c)
      base_[c] = rank.arena().stats().category_current[c];
  }
  void constructed() {
    for (std::size_t c = 0; c < kCategoryCount; ++c)
      out_.resident[c] = rank_.arena().stats().category_current[c] - base_[c];
  }
  template <class Forward, class Backward>
  void steps(int n, Forward forward, Backward backward) {
    for (int step = 0; step < n; ++step) {
      pass(forward, out_.forward, out_.forward_phases, out_.forward_traffic);
      pass(backward, out_.backward, out_.backward_phases, out_.backward_traffic);
    }
  }

 private:
  // One pass with peaks and counters restarted at its start.
  template <class Pass>
  void pass(Pass run, ArenaStats& stats, PhasePeaks& phases, TrafficCounters& traffic) {
    Arena& a = rank_.arena();
    a.reset_peaks();
    rank_.counters().clear();
    run();
    traffic = rank_.counters();
    stats = a.stats();
    phases = a.phase_peaks();
  }

  Rank& rank_;
  RankLayerMeasure& out_;
  std::array<std::size_t, kCategoryCount> base_{};
};

}  // namespace

LayerMeasure measure_layer(const ref::ModelConfig& model, int B, int S, const cost::Strategy& st,
                           const LayerMeasureOptions& o) {
  if (o.steps < 1)
    throw std::invalid_argument("measure_layer: steps=" + std::to_string(o.steps) +
                                " must be >= 1");
  LayerProblem p{.model = model, .B = B, .S = S, .tsp = {}};
  p.tsp.head_buckets = o.head_buckets;
  p.tsp.keep_attention_shards = o.keep_attention_shards;
  p.tsp.keep_kv = o.keep_kv;
  p.tsp.overlap = o.overlap;
  if (const auto v =
          violation(cost::ModelShape::from(model, B, S), st, {.head_buckets = o.head_buckets}))
    throw std::invalid_argument(st.name() + ": " + v->message);
  const StrategyBlocks& info = strategy_blocks(st.scheme);
  // A dry run's blocks never read the master weights (their constructors test dry_run()).
  const ref::LayerWeights<float> w =
      o.dry ? ref::LayerWeights<float>{} : ref::LayerWeights<float>::zeros(model);
  WorldOptions wo;  // assigned, not designated: WorldOptions grows fields
  wo.ranks = st.ranks();
  wo.arena_capacity = o.capacity;
  wo.dry_run = o.dry;
  World world(wo);
  LayerMeasure out;
  out.ranks.resize(static_cast<std::size_t>(wo.ranks));
  const auto t0 = std::chrono::steady_clock::now();
  world.run([&](Rank& r) {
    const std::size_t local =
        info.place(p, st, r.id()).positions.size() * static_cast<std::size_t>(B) * model.hidden;
    StepRecorder rec(r, out.ranks[static_cast<std::size_t>(r.id())]);
    const std::unique_ptr<RankLayer> layer = info.make_layer(r, p, st, w);
    rec.constructed();
    // The layer's input, output and gradient buffers, as `run` holds them.
    Arena& a = r.arena();
    auto x = a.allocate<float>(local, Category::activations, /*zero=*/true);
    auto y = a.allocate<float>(local, Category::activations);
    auto dx = a.allocate<float>(local, Category::workspace);
    rec.steps(
        o.steps, [&] { layer->forward(x.data(), y.data()); },
        [&] { layer->backward(x.data(), y.data(), dx.data()); });
  });
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tspemu::tsp
