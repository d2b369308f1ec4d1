// measure_layer: one layer of a strategy run by its real blocks — dry at any size, or for real —
// and what each rank allocated and communicated.
//
// What: builds one layer of the strategy on every rank with the strategy table's block factory
// (strategy.hpp: TspLayer; BaselineAttention then BaselineMlp; the Ulysses / ring core, then
// SequenceShardedAttention, then SP's BaselineMlp), allocates the layer's input, output and input
// gradient as `run` does, and runs `steps` training steps (forward, then backward). Dry (the
// default): a World with WorldOptions::dry_run, so the arena accounts without backing and kernels
// and copies skip their bytes — the paper's 7B-class model at S = 128K on 8 ranks runs in seconds,
// in no memory. Real: zero weights and inputs (memory and traffic do not depend on values), for
// checking the dry run. This is where per-rank memory of a strategy comes from (tspemu plan
// --dry-run, run, compare, the tests); the cost model keeps only closed forms (cost_model.hpp).
// Requirements: the strategy's shape rules (strategy.hpp's violation()): std::invalid_argument
// with the rule's message, before any rank runs.
// Guarantees: per rank, the last step's counters and arena stats of each pass, peaks restarted at
// the start of each pass (the first forward: from the constructed layer and its buffers), and the
// bytes the blocks hold after construction. Dry and real runs report identical numbers
// (tests/tsp/cost_model_test.cpp). Elements are the emulator's floats (cost::ElementSizes::
// fp32_emulator()).
// Cost: dry, the blocks' control flow and the collectives' meetings only (no arithmetic, no
// copies); real, a training step.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tspemu/plan/cost_model.hpp"
#include "tspemu/reference/model_config.hpp"
#include "tspemu/runtime/arena.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {

struct LayerMeasureOptions {
  bool dry = true;
  int steps = 1;  // training steps on the same layer; the last is reported
  // TSP only (tsp_shape.hpp).
  int head_buckets = 1;
  bool keep_attention_shards = false;
  bool keep_kv = false;
  bool overlap = true;  // TspOptions::overlap
  // Emulated device memory per rank (OutOfMemory past it, dry or not).
  std::size_t capacity = std::size_t{1} << 40;
};

using PhasePeaks = std::map<std::string, std::size_t, std::less<>>;

struct RankLayerMeasure {
  std::array<std::size_t, kCategoryCount> resident{};  // the blocks' bytes after construction
  ArenaStats forward, backward;                        // at the end of each pass
  PhasePeaks forward_phases, backward_phases;          // Arena::phase_peaks() of each pass
  TrafficCounters forward_traffic, backward_traffic;
};

struct LayerMeasure {
  std::vector<RankLayerMeasure> ranks;
  double seconds = 0;  // wall time of the world's run: construction and every step
};

LayerMeasure measure_layer(const ref::ModelConfig& model, int B, int S, const cost::Strategy& st,
                           const LayerMeasureOptions& options = {});

}  // namespace tspemu::tsp
