#include "tspemu/tsp/layer_measure.hpp"

#include <chrono>
#include <memory>
#include <utility>

#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_attention.hpp"
#include "tspemu/tsp/baseline_mlp.hpp"
#include "tspemu/tsp/baseline_shape.hpp"
#include "tspemu/tsp/ring_attention.hpp"
#include "tspemu/tsp/sequence_sharded_attention.hpp"
#include "tspemu/tsp/tsp_layer.hpp"
#include "tspemu/tsp/ulysses_attention.hpp"

namespace tspemu::tsp {

namespace {

using cost::Scheme;

BaselineShape mesh_shape(const ref::ModelConfig& m, int B, int S, const cost::Strategy& st) {
  switch (st.scheme) {
    case Scheme::tp:
      return BaselineShape::tp(m, st.T, B, S);
    case Scheme::megatron_sp:
      return BaselineShape::megatron_sp(m, st.T, B, S);
    case Scheme::sp:
    case Scheme::ulysses:  // the SP shape: zigzag tokens, replicated weights
    case Scheme::ring:
      return BaselineShape::sp(m, st.Sp, B, S);
    case Scheme::tp_sp:
      return BaselineShape::tp_sp(m, st.T, st.Sp, B, S);
    case Scheme::tsp:
      break;
  }
  throw std::invalid_argument("measure_layer: " + st.name() + " is not a mesh strategy");
}

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

void run_tsp(World& world, const TspShape& s, const ref::LayerWeights<float>& w, int steps,
             LayerMeasure& out) {
  const std::size_t local = static_cast<std::size_t>(s.B) * s.Tl() * s.model.hidden;
  world.run([&](Rank& r) {
    StepRecorder rec(r, out.ranks[static_cast<std::size_t>(r.id())]);
    TspLayer layer(r, s, w);
    rec.constructed();
    Arena& a = r.arena();
    auto x = a.allocate<float>(local, Category::activations, /*zero=*/true);
    auto y = a.allocate<float>(local, Category::activations);
    auto dx = a.allocate<float>(local, Category::workspace);
    rec.steps(
        steps, [&] { layer.forward(x.data(), y.data()); },
        [&] { layer.backward(x.data(), y.data(), dx.data()); });
  });
}

template <class MakeAttention>
void run_mesh(World& world, const BaselineShape& s, const ref::LayerWeights<float>& w, int steps,
              LayerMeasure& out, MakeAttention make) {
  const std::size_t local = static_cast<std::size_t>(s.B) * s.rows() * s.model.hidden;
  world.run([&](Rank& r) {
    StepRecorder rec(r, out.ranks[static_cast<std::size_t>(r.id())]);
    auto att = make(r, s, w);  // first: a core allocates before its block
    BaselineMlp mlp(r, s, w);
    rec.constructed();
    Arena& a = r.arena();
    auto x = a.allocate<float>(local, Category::activations, /*zero=*/true);
    auto mid = a.allocate<float>(local, Category::activations);
    auto y = a.allocate<float>(local, Category::activations);
    auto dmid = a.allocate<float>(local, Category::workspace);
    auto dx = a.allocate<float>(local, Category::workspace);
    rec.steps(
        steps,
        [&] {
          att->forward(x.data(), mid.data());
          mlp.forward(mid.data(), y.data());
        },
        [&] {
          mlp.backward(mid.data(), y.data(), dmid.data());
          att->backward(x.data(), dmid.data(), dx.data());
        });
  });
}

}  // namespace

LayerMeasure measure_layer(const ref::ModelConfig& model, int B, int S, const cost::Strategy& st,
                           const LayerMeasureOptions& o) {
  if (o.steps < 1)
    throw std::invalid_argument("measure_layer: steps=" + std::to_string(o.steps) +
                                " must be >= 1");
  TspShape tsp;
  BaselineShape mesh;
  if (st.scheme == Scheme::tsp) {
    tsp.model = model;
    tsp.D = st.D;
    tsp.B = B;
    tsp.S = S;
    tsp.options.head_buckets = o.head_buckets;
    tsp.options.keep_attention_shards = o.keep_attention_shards;
    tsp.options.keep_kv = o.keep_kv;
    tsp.validate();
  } else {
    mesh = mesh_shape(model, B, S, st);
    mesh.validate();
    if (st.scheme == Scheme::ulysses) check_ulysses_shape(mesh);
  }
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
  if (st.scheme == Scheme::tsp) {
    run_tsp(world, tsp, w, o.steps, out);
  } else if (st.attention_core()) {
    const bool ulysses = st.scheme == Scheme::ulysses;
    run_mesh(world, mesh, w, o.steps, out,
             [ulysses](Rank& r, const BaselineShape& s, const ref::LayerWeights<float>& lw) {
               auto core = ulysses ? ulysses_attention_core(r, s) : ring_attention_core(r, s);
               return std::make_unique<SequenceShardedAttention>(r, s, lw, std::move(core));
             });
  } else {
    run_mesh(world, mesh, w, o.steps, out,
             [](Rank& r, const BaselineShape& s, const ref::LayerWeights<float>& lw) {
               return std::make_unique<BaselineAttention>(r, s, lw);
             });
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tspemu::tsp
