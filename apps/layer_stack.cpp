#include "layer_stack.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string_view>
#include <tuple>

#include "mpi_job.hpp"
#include "tspemu/check/token_shards.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/barrier.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/strategy.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

namespace {

// The reference's seeded normal stream (init.hpp), rounded to float.
std::vector<float> normal_floats(std::size_t n, std::uint64_t seed, std::string_view name) {
  const std::vector<double> d = ref::normal_stream(seed, name, n);
  return {d.begin(), d.end()};
}

// Full-size outputs of one implementation: y, dx and every layer's gradients.
template <class T>
struct StackTensors {
  std::vector<T> y, dx;
  std::vector<ref::LayerWeights<T>> grads;
};

template <class T>
StackTensors<T> reference_stack(const ref::ModelConfig& m,
                                const std::vector<ref::LayerWeights<T>>& w, const std::vector<T>& x,
                                const std::vector<T>& dy, int B, int S) {
  ref::StackCache<T> cache;
  StackTensors<T> r;
  r.y = ref::layer_stack_forward(m, w, x, B, S, cache);
  ref::layer_stack_backward(m, w, dy, B, S, cache, r.dx, r.grads);
  return r;
}

// The tensors judged, in order: "y", "dx", then "grad layers.N.<name>" for each layer's tensors
// in the order of ref::kLayerTensors.
template <class T, class Fn>
void for_each_tensor(StackTensors<T>& t, Fn fn) {
  fn("y", t.y);
  fn("dx", t.dx);
  for (std::size_t l = 0; l < t.grads.size(); ++l) {
    const std::string p = "grad layers." + std::to_string(l) + ".";
    for (auto& [name, v] : t.grads[l].named()) fn(p + name, *v);
  }
}

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The layer stack of any strategy: per rank, its placement and L layers from the strategy
// table's block factory (strategy.hpp), the seeded input and upstream gradient scattered to its
// token rows, forward then backward, and (checked) its share of the full outputs and gradients.
void run_layers(const StackConfig& c, World& world, const std::vector<ref::LayerWeights<float>>& w,
                const std::vector<float>& x, const std::vector<float>& dy, StackResult& out,
                StackTensors<float>& got) {
  const tsp::StrategyBlocks& strategy = tsp::strategy_blocks(c.strategy.scheme);
  const tsp::LayerProblem problem = layer_problem(c);
  const int L = c.model.n_layers, C = c.model.hidden;
  world.run([&](Rank& rank) {
    const int p = rank.id();
    Arena& a = rank.arena();
    const tsp::RankPlacement place = strategy.place(problem, c.strategy, p);
    const check::TokenShard rows{0, c.B, place.positions};
    const std::size_t local = static_cast<std::size_t>(c.B) * rows.positions.size() * C;
    std::vector<std::unique_ptr<tsp::RankLayer>> layers;
    layers.reserve(w.size());
    for (const auto& lw : w) layers.push_back(strategy.make_layer(rank, problem, c.strategy, lw));
    std::vector<Buffer<float>> act;
    for (int l = 0; l <= L; ++l) act.push_back(a.allocate<float>(local, Category::activations));
    auto g = a.allocate<float>(local, Category::workspace);
    auto g_next = a.allocate<float>(local, Category::workspace);
    check::scatter_rows(rows, c.S, C, x.data(), act[0].data());
    check::scatter_rows(rows, c.S, C, dy.data(), g.data());
    a.reset_peaks();
    StepClock clock(rank, out);
    clock.start();
    for (std::size_t l = 0; l < layers.size(); ++l) {
      layers[l]->forward(act[l].data(), act[l + 1].data());
      if (p == 0 && c.on_step) c.on_step();
    }
    clock.forward_done();
    if (p == c.fail_rank) throw std::runtime_error("injected failure (--inject-failure-rank)");
    for (std::size_t l = layers.size(); l-- > 0;) {
      layers[l]->backward(act[l].data(), g.data(), g_next.data());
      std::swap(g, g_next);
      if (p == 0 && c.on_step) c.on_step();
    }
    clock.backward_done();
    if (!c.check) return;
    // One replica writes each element (placement.reports_*), rank 0 the norms: the ranks fill
    // disjoint parts of the full tensors concurrently.
    if (place.reports_tokens) {
      check::gather_rows(rows, c.S, C, act.back().data(), got.y.data());
      check::gather_rows(rows, c.S, C, g.data(), got.dx.data());
    }
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const tsp::RankLayer& layer = *layers[l];
      tsp::unpack_layer<float>({layer.attention_grad_shard(), layer.attention_grad_norm(),
                                layer.mlp_grad_shard(), layer.mlp_grad_norm()},
                               place.shard_shape, place.shard, place.reports_shard, p == 0,
                               got.grads[l]);
    }
  });
}

}  // namespace

tsp::LayerProblem layer_problem(const StackConfig& c) {
  tsp::LayerProblem p;
  p.model = c.model;
  p.B = c.B;
  p.S = c.S;
  p.tsp.layout = c.layout;
  p.tsp.head_buckets = c.head_buckets;
  p.tsp.overlap = c.overlap;
  return p;
}

tsp::TspShape tsp_shape(const StackConfig& c) {
  tsp::TspShape s;
  s.model = c.model;
  s.D = c.strategy.D;
  s.B = c.B;
  s.S = c.S;
  s.options.layout = c.layout;
  s.options.head_buckets = c.head_buckets;
  s.options.overlap = c.overlap;
  return s;
}

void validate_stack(const StackConfig& c) {
  c.model.validate();
  if (c.B < 1 || c.S < 1)
    throw std::invalid_argument(c.strategy.name() + ": B=" + std::to_string(c.B) +
                                " and S=" + std::to_string(c.S) + " must be >= 1");
  const tsp::RuleOptions rules{.tsp_layout = c.layout, .head_buckets = c.head_buckets};
  if (const auto v = tsp::violation(cost::ModelShape::from(c.model, c.B, c.S), c.strategy, rules))
    throw std::invalid_argument(c.strategy.name() + ": " + v->message);
}

void StepClock::start() {
  barrier(rank_.comm());
  rank_.counters().clear();
  t0_ = std::chrono::steady_clock::now();
}

void StepClock::forward_done() {
  out_.ranks[static_cast<std::size_t>(rank_.id())].forward = rank_.counters();
  rank_.counters().clear();
}

void StepClock::backward_done() {
  RankMeasure& m = out_.ranks[static_cast<std::size_t>(rank_.id())];
  m.backward = rank_.counters();
  barrier(rank_.comm());
  if (rank_.id() == 0) out_.seconds = seconds_between(t0_, std::chrono::steady_clock::now());
  m.arena = rank_.arena().stats();
}

void check_traffic(
    StackResult& out,
    const std::function<std::pair<TrafficCounters, TrafficCounters>(int rank)>& model) {
  out.traffic_match = true;
  for (std::size_t r = 0; r < out.ranks.size(); ++r) {
    RankMeasure& m = out.ranks[r];
    std::tie(m.model_forward, m.model_backward) = model(static_cast<int>(r));
    m.traffic_match = m.forward == m.model_forward && m.backward == m.model_backward;
    out.traffic_match = out.traffic_match && m.traffic_match;
  }
}

void check_memory(StackResult& out, int layers, std::uint64_t extra) {
  const auto L = static_cast<std::uint64_t>(layers);
  const auto& lm = out.layer_model;
  out.model_weights = L * lm.resident[static_cast<std::size_t>(Category::weights)] + extra;
  out.model_gradients =
      L * lm.backward.category_current[static_cast<std::size_t>(Category::gradients)] + extra;
  out.memory_match = true;
  for (const RankMeasure& m : out.ranks)
    out.memory_match =
        out.memory_match &&
        m.arena.category_peak[static_cast<std::size_t>(Category::weights)] == out.model_weights &&
        m.arena.category_peak[static_cast<std::size_t>(Category::gradients)] == out.model_gradients;
}

void judge(StackResult& out, const std::string& name, std::span<const float> parallel,
           std::span<const float> reference, std::span<const double> oracle, double k) {
  check::TensorResult t = check::judge_tensor(name, parallel, reference, oracle, k);
  out.numerics_ok = out.numerics_ok && t.ok();
  out.max_err_ratio = std::max(out.max_err_ratio, std::isfinite(t.ratio) ? t.ratio : HUGE_VAL);
  out.tensors.push_back(std::move(t));
}

int stack_steps(const StackConfig& c, bool whole_model) {
  return (whole_model ? 2 : 2 * c.model.n_layers) + (c.check ? 2 : 0);
}

WorldOptions stack_world_options(const StackConfig& c, int ranks) {
  WorldOptions o;  // assigned, not designated: WorldOptions grows fields
  o.ranks = ranks;
  o.pin_threads = c.pin;
  o.trace = !c.trace_path.empty();
  // ~20 MiB of events per rank: a few layers of a default run, counted when exceeded.
  o.trace_capacity = std::size_t{1} << 18;
  o.sim_clock = c.sim_clock;
  o.inject = c.inject;
  o.mpi = mpi_job().spans();  // under mpirun: the ranks spread over the job's processes
  return o;
}

void share_measures(StackResult& out) {
  share_per_rank(out.ranks);
  share_from_printer(std::as_writable_bytes(std::span(&out.seconds, 1)));  // rank 0's clock
}

void finish_debugging(const StackConfig& c, const World& world, StackResult& out) {
  if (c.sim_clock)
    for (int r = 0; r < world.size(); ++r) {
      out.simulated_time.push_back(world.simulated_time(r));
      if (world.simulated_seconds(r) > out.simulated_seconds) {
        out.simulated_seconds = world.simulated_seconds(r);
        out.slowest_rank = r;
      }
    }
  if (c.trace_path.empty() || !mpi_job().prints()) return;
  const Trace t = world.trace();
  for (int r = 0; r < world.size(); ++r) {
    out.trace_events += t.events(r).size();
    out.trace_dropped += t.dropped(r);
  }
  t.write_chrome_json(c.trace_path);
}

ref::ModelWeights<float> initial_weights(const StackConfig& c) {
  if (c.weights) return *c.weights;
  ref::ModelConfig wm = c.model;
  if (wm.vocab <= 0) wm.vocab = 2;  // the stack has no embedding; init_weights wants a vocabulary
  return ref::convert_weights<float>(ref::init_weights<double>(wm, c.seed));
}

StackResult run_stack(const StackConfig& c) {
  validate_stack(c);
  const int L = c.model.n_layers, n = c.strategy.ranks();
  const std::size_t full = static_cast<std::size_t>(c.B) * c.S * c.model.hidden;
  const auto w32 = initial_weights(c);
  const std::vector<float> x = normal_floats(full, c.seed, "x");
  const std::vector<float> dy = normal_floats(full, c.seed, "dy");

  StackResult out;
  out.scope = "layer stack: " + std::to_string(L) +
              " x (attention block, MLP block), forward + backward; no embedding, LM head or loss";
  out.ranks.resize(static_cast<std::size_t>(n));
  StackTensors<float> got;
  if (c.check) {
    got.y.resize(full);
    got.dx.resize(full);
    got.grads.assign(static_cast<std::size_t>(L), ref::LayerWeights<float>::zeros(c.model));
  }
  World world(stack_world_options(c, n));
  run_layers(c, world, w32.layers, x, dy, out, got);
  share_measures(out);
  finish_debugging(c, world, out);
  out.tokens_per_s = static_cast<double>(c.B) * c.S / out.seconds;

  const cost::ModelShape ms = cost::ModelShape::from(c.model, c.B, c.S);
  const cost::ElementSizes es = cost::ElementSizes::fp32_emulator();
  const cost::CostOptions opt{.head_buckets = c.head_buckets};
  check_traffic(out, [&](int r) {
    const cost::LayerTraffic t = cost::layer_traffic(ms, c.strategy, es, opt, r);
    return std::pair{t.forward * static_cast<std::uint64_t>(L),
                     t.backward * static_cast<std::uint64_t>(L)};
  });
  out.layer_model = tsp::measure_layer(c.model, c.B, c.S, c.strategy,
                                       {.head_buckets = c.head_buckets, .overlap = c.overlap})
                        .ranks[0];
  check_memory(out, L);
  if (!c.check) return out;
  // Under mpirun: process 0 judges every tensor, with the parts other processes' ranks wrote.
  for_each_tensor(got, [](const std::string&, std::vector<float>& v) { merge_written(v); });
  if (!mpi_job().prints()) return out;

  const auto w_oracle = ref::convert_weights<double>(w32);
  const std::vector<double> x64(x.begin(), x.end()), dy64(dy.begin(), dy.end());
  const auto t0 = std::chrono::steady_clock::now();
  StackTensors<float> r32 = reference_stack(c.model, w32.layers, x, dy, c.B, c.S);
  out.reference_seconds = seconds_between(t0, std::chrono::steady_clock::now());
  if (c.on_step) c.on_step();
  StackTensors<double> o64 = reference_stack(c.model, w_oracle.layers, x64, dy64, c.B, c.S);
  if (c.on_step) c.on_step();
  std::vector<std::span<const float>> ref_spans, got_spans;
  std::vector<std::span<const double>> oracle_spans;
  std::vector<std::string> names;
  for_each_tensor(got, [&](const std::string& name, const std::vector<float>& v) {
    names.push_back(name);
    got_spans.emplace_back(v);
  });
  for_each_tensor(
      r32, [&](const std::string&, const std::vector<float>& v) { ref_spans.emplace_back(v); });
  for_each_tensor(
      o64, [&](const std::string&, const std::vector<double>& v) { oracle_spans.emplace_back(v); });
  for (std::size_t i = 0; i < names.size(); ++i)
    judge(out, names[i], got_spans[i], ref_spans[i], oracle_spans[i], c.k);
  return out;
}

}  // namespace tspemu::app
