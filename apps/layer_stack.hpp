// A training step (forward + backward) of L stacked layers — attention block then MLP block per
// layer, no embedding and no LM head — under any strategy of the strategy table (strategy.hpp:
// each rank's placement and layers come from its entry's block factory), measured (time, arena
// peaks, bytes per collective kind) and checked:
//   * traffic: each rank's counters against L × cost::layer_traffic for that rank, exactly;
//   * numerics (optional): every output and gradient against the same stack run by the reference
//     in float and in double (the fp64 oracle), with the rule of reference/numerics.hpp.
// Inputs are seeded: weights from ref::init_weights (or a checkpoint's), the stack's input and
// upstream gradient from a normal distribution. This is what `run --strategy <baseline>`, `compare`
// and `scale` run; the baselines exist only as layer blocks, so TSP runs the same stack there for a
// like-for-like row.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tspemu/check/block_check.hpp"
#include "tspemu/plan/cost_model.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/model_config.hpp"
#include "tspemu/runtime/arena.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/layer_measure.hpp"
#include "tspemu/tsp/sequence_layout.hpp"
#include "tspemu/tsp/strategy.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu {
class Rank;
}

namespace tspemu::app {

struct StackConfig {
  ref::ModelConfig model;  // n_layers is L; vocab is unused
  int B = 1;
  int S = 0;
  tsp::cost::Strategy strategy;
  tsp::LayoutKind layout = tsp::LayoutKind::zigzag;  // TSP only; the others use zigzag rows
  int head_buckets = 1;                              // TSP only
  bool overlap = true;                               // TSP only: TspOptions::overlap
  std::uint64_t seed = 1;
  // The weights to run (--weights: a checkpoint's, model their config); null: seeded from seed.
  std::shared_ptr<const ref::ModelWeights<float>> weights;
  double k = 3.0;     // the oracle rule's factor, as tests/tsp uses
  bool check = true;  // run the reference and the oracle and judge every tensor
  bool pin = false;   // WorldOptions::pin_threads
  // Progress: called by rank 0 after each layer, forward and backward (the whole model: after
  // each pass), then after the reference and after the oracle.
  std::function<void()> on_step;
  // Debugging: write the run's Chrome trace here (empty: no trace); estimate the step on this
  // cluster model (sim_clock.hpp); run under seeded injection (injection.hpp).
  std::string trace_path;
  std::optional<SimClockModel> sim_clock;
  std::optional<Injection> inject;
  // This rank throws after its forward pass (-1: none), to see a failure reported (failure_test).
  int fail_rank = -1;
};

// The world a run of c uses: n ranks, pinning, and the debugging options.
WorldOptions stack_world_options(const StackConfig& c, int ranks);

// The fp32 weights a run of c starts from: c.weights, or ref::init_weights(c.model, c.seed) in
// double rounded to float (a stack without vocabulary gets a 2-token one, unused).
ref::ModelWeights<float> initial_weights(const StackConfig& c);

// The TSP shape of c (strategy TSP).
tsp::TspShape tsp_shape(const StackConfig& c);
// The problem the strategy table's factories build c's blocks for.
tsp::LayerProblem layer_problem(const StackConfig& c);
// Throws std::invalid_argument when the strategy cannot run this shape (the strategy table's rule).
void validate_stack(const StackConfig& c);
// The number of on_step calls one run makes (run_stack, or run_model when whole_model).
int stack_steps(const StackConfig& c, bool whole_model = false);

struct RankMeasure {
  ArenaStats arena;  // peaks over forward + backward, from after construction
  TrafficCounters forward, backward;
  TrafficCounters model_forward, model_backward;  // L × the cost model for this rank
  bool traffic_match = false;
};

struct StackResult {
  std::string scope;   // what ran: "layer stack (...)" or "whole model (...)"
  double seconds = 0;  // forward + backward, barrier to barrier
  double tokens_per_s = 0;
  double reference_seconds = 0;  // the single-thread fp32 reference, forward + backward
  std::vector<RankMeasure> ranks;
  bool traffic_match = false;  // every rank, every kind, calls and bytes both ways
  // Rank 0 of one layer run dry (tsp/layer_measure.hpp), for weights and gradients per layer.
  tsp::RankLayerMeasure layer_model;
  // Weights and gradients per rank: L × the dry layer (+ the vocabulary shards and final norm of
  // the whole model), and whether every rank's arena peak equals them.
  std::uint64_t model_weights = 0, model_gradients = 0;
  bool memory_match = false;
  std::vector<check::TensorResult> tensors;  // empty unless checked (check::judge_tensor)
  double max_err_ratio = 0;                  // max over tensors of parallel_err / bound
  bool numerics_ok = true;
  // Debugging: the simulated step (max over ranks; -1 without a simulated clock), the trace's
  // events (all ranks) and events dropped for lack of buffer space.
  double simulated_seconds = -1;
  // Per rank: compute, exposed and overlapped communication on the simulated clock (empty
  // without a simulated clock).
  std::vector<World::SimulatedTime> simulated_time;
  // The rank whose clock is the simulated step (-1 without a simulated clock).
  int slowest_rank = -1;
  std::uint64_t trace_events = 0, trace_dropped = 0;
  bool pass() const { return traffic_match && numerics_ok; }
};

StackResult run_stack(const StackConfig& c);
// After the run, under mpirun (mpi_job.hpp): every rank's measures (out.ranks, written by the
// ranks' own processes) and rank 0's out.seconds, into every process.
void share_measures(StackResult& out);
// After the run: writes the trace file and reads the simulated clocks into out (as c asks).
void finish_debugging(const StackConfig& c, const World& world, StackResult& out);

// One rank's timing and counters of a step, barrier to barrier so that rank 0's clock covers
// every rank's work; the barriers themselves are not counted. out.ranks must be sized.
class StepClock {
 public:
  StepClock(Rank& rank, StackResult& out) : rank_(rank), out_(out) {}
  void start();
  void forward_done();
  void backward_done();  // also records the rank's arena stats

 private:
  Rank& rank_;
  StackResult& out_;
  std::chrono::steady_clock::time_point t0_;
};

// Sets each rank's model traffic (model(rank) -> {forward, backward}) and the match flags.
void check_traffic(
    StackResult& out,
    const std::function<std::pair<TrafficCounters, TrafficCounters>(int rank)>& model);

// Sets model_weights / model_gradients to L × the dry layer plus `extra` bytes each, and
// memory_match from every rank's arena peaks.
void check_memory(StackResult& out, int layers, std::uint64_t extra = 0);

// Judges one tensor by the oracle rule (check::judge_tensor) and records it in out (tensors,
// numerics_ok, max_err_ratio).
void judge(StackResult& out, const std::string& name, std::span<const float> parallel,
           std::span<const float> reference, std::span<const double> oracle, double k);

}  // namespace tspemu::app
