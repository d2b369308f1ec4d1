// Run memory: what a `run`, `compare` or `scale` point holds at least, computed before anything is
// allocated, and the refusal of a run that cannot fit.
//
// What: per rank, the arena bytes of the L-layer stack at the end of its forward pass — L × (one
// layer's blocks and the activations it keeps for backward), measured by one dry layer
// (tsp/layer_measure.hpp) at the run's size, plus the stack's L + 3 activation buffers and, for
// TSP's whole model, the vocabulary shards and final norm; on the host, the full-size tensors the
// run keeps outside the arenas: the seeded weights (double, then float), the input and upstream
// gradient and, when checked, the gathered outputs and the float reference's and the fp64 oracle's
// stacks (activations, weights, gradients; not their per-layer caches).
// Guarantees: each figure is a lower bound of what the run allocates (transients and caches not
// counted), so a refusal never refuses a run that fits. Sizes are 64-bit: no overflow below
// 2^63 bytes. Nothing is allocated for real: the dry layer's arena only accounts.
// Cost: one dry layer (milliseconds at small sizes; the closed forms first, so sizes that cannot
// fit on the host are refused before it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "layer_stack.hpp"

namespace tspemu::app {

struct RunMemory {
  std::uint64_t host = 0;           // outside the arenas
  std::vector<std::uint64_t> rank;  // each rank's arena, empty when not measured
  std::uint64_t max_rank() const;
  std::uint64_t total() const;  // host + every rank's arena
};

// The host bytes of c's run (closed forms; no allocation).
std::uint64_t run_host_bytes(const StackConfig& c, bool whole_model);

// The memory of c's run: host bytes, then (if they fit in `available`) each rank's arena from a
// dry layer measured within `capacity` per rank. Throws ConfigError, naming `what` (e.g. "run
// TSP D=4"), GiB per rank and in total, `available` and `capacity`, when the run cannot fit.
RunMemory require_run_memory(const StackConfig& c, bool whole_model, const std::string& what,
                             std::uint64_t available, std::size_t capacity);

// MemAvailable of /proc/meminfo in bytes (UINT64_MAX when it cannot be read: no refusal).
std::uint64_t available_memory();

}  // namespace tspemu::app
