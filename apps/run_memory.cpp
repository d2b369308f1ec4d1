#include "run_memory.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "problem_options.hpp"
#include "tspemu/plan/cost_model.hpp"
#include "tspemu/runtime/arena.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/tsp/layer_measure.hpp"
#include "tspemu/tsp/strategy.hpp"

namespace tspemu::app {

namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

// Saturating: a figure past 2^64 bytes stays "more than anything".
std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  return a > kMax - b ? kMax : a + b;
}
std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  return b != 0 && a > kMax / b ? kMax : a * b;
}

// The arena's charge for n floats: whole 64-byte units (arena.hpp).
std::uint64_t charged_floats(std::uint64_t n) {
  return mul(add(n, 15) / 16, 64);
}

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0));
}

// Lower bound of every rank's arena without running anything: the stack's L + 3 activation
// buffers of at least B·S/n token rows each (no strategy holds fewer rows than its share).
std::uint64_t rank_buffers_bound(const StackConfig& c) {
  const std::uint64_t n = u64(c.strategy.ranks());
  const std::uint64_t rows = u64(c.S) / std::max<std::uint64_t>(n, 1);
  const std::uint64_t buf = charged_floats(mul(mul(u64(c.B), rows), u64(c.model.hidden)));
  return mul(add(u64(c.model.n_layers), 3), buf);
}

// Each rank's arena at the end of the stack's forward pass, from one dry layer: L × (its blocks
// and what the layer keeps for backward: the dry layer's bytes after forward less its three
// buffers) + the stack's L + 3 buffers (+ the whole model's vocabulary tensors and gradients).
std::vector<std::uint64_t> rank_bytes(const StackConfig& c, bool whole_model,
                                      std::size_t capacity) {
  tsp::LayerMeasureOptions o;
  o.capacity = capacity;
  o.head_buckets = c.head_buckets;
  o.overlap = c.overlap;
  const tsp::LayerMeasure m = tsp::measure_layer(c.model, c.B, c.S, c.strategy, o);
  tsp::LayerProblem p{.model = c.model, .B = c.B, .S = c.S, .tsp = {}};
  p.tsp.head_buckets = c.head_buckets;
  p.tsp.overlap = c.overlap;
  const tsp::StrategyBlocks& info = tsp::strategy_blocks(c.strategy.scheme);
  const std::uint64_t L = u64(c.model.n_layers);
  std::uint64_t vocab = 0;
  if (whole_model) {
    const std::uint64_t shards = u64(tsp::cost::vocab_shards(c.strategy));
    const std::uint64_t shard =
        charged_floats(mul(u64(c.model.vocab) / shards, u64(c.model.hidden)));
    const std::uint64_t tensors =
        add(mul(c.model.tie_embeddings ? 1 : 2, shard), charged_floats(u64(c.model.hidden)));
    vocab = mul(2, tensors);  // and a gradient of each
  }
  std::vector<std::uint64_t> out;
  for (int r = 0; r < c.strategy.ranks(); ++r) {
    const std::uint64_t rows = info.place(p, c.strategy, r).positions.size();
    const std::uint64_t buf = charged_floats(mul(mul(u64(c.B), rows), u64(c.model.hidden)));
    const std::uint64_t after_forward = m.ranks[static_cast<std::size_t>(r)].forward.current;
    const std::uint64_t per_layer = after_forward > 3 * buf ? after_forward - 3 * buf : 0;
    out.push_back(add(add(mul(L, per_layer), mul(add(L, 3), buf)), vocab));
  }
  return out;
}

}  // namespace

std::uint64_t RunMemory::max_rank() const {
  return rank.empty() ? 0 : *std::max_element(rank.begin(), rank.end());
}

std::uint64_t RunMemory::total() const {
  std::uint64_t t = host;
  for (std::uint64_t r : rank) t = add(t, r);
  return t;
}

std::uint64_t run_host_bytes(const StackConfig& c, bool whole_model) {
  const tsp::cost::ModelShape ms = tsp::cost::ModelShape::from(c.model, c.B, c.S);
  // W: the weights' elements; N: one [B, S, h] activation's.
  std::uint64_t W = mul(u64(ms.layers), u64(ms.layer_params()));
  if (whole_model) W = add(W, u64(ms.vocab_params()));
  const std::uint64_t N = mul(mul(u64(c.B), u64(c.S)), u64(c.model.hidden));
  if (whole_model)
    // Weights in double and float and the float gradients (+ the reference's float and the
    // oracle's double gradients and the oracle's weights, checked).
    return mul(W, c.check ? 36 : 16);
  // Seeding: the double weights beside their float copy, then x and dy with one double stream.
  const std::uint64_t seeded = std::max(mul(12, W), add(mul(4, W), mul(12, N)));
  if (!c.check) return seeded;
  // During the oracle's backward: float weights, x and dy; the gathered y, dx and gradients; the
  // float reference's y, dx and gradients; the oracle's weights, x, dy, L + 1 activations,
  // gradients and its y, dx and running gradient.
  const std::uint64_t L1 = add(u64(ms.layers), 1);
  return std::max(seeded, add(mul(28, W), add(mul(64, N), mul(mul(8, N), L1))));
}

RunMemory require_run_memory(const StackConfig& c, bool whole_model, const std::string& what,
                             std::uint64_t available, std::size_t capacity) {
  RunMemory need;
  need.host = run_host_bytes(c, whole_model);
  const int n = c.strategy.ranks();
  auto refuse = [&](const std::string& why) {
    std::ostringstream m;
    m << "memory: " << what << " needs at least " << format_bytes(need.max_rank())
      << " per rank (arena "
      << "capacity " << format_bytes(capacity) << ") and " << format_bytes(need.total())
      << " in total (" << n << " ranks' arenas and " << format_bytes(need.host)
      << " of full-size tensors on the host; " << format_bytes(available)
      << " available, MemAvailable in /proc/meminfo): " << why
      << "; lower --layers, --hidden, --ffn, --seq or --batch";
    throw ConfigError(m.str());
  };
  // Closed forms first: sizes far past the machine are refused before any dry run.
  need.rank.assign(static_cast<std::size_t>(n), rank_buffers_bound(c));
  if (need.max_rank() > capacity) refuse("a rank's arena exceeds its capacity");
  if (need.total() > available) refuse("more than the machine's available memory");
  try {
    need.rank = rank_bytes(c, whole_model, capacity);
  } catch (const RankFailure& e) {
    std::string first = e.what();
    first = first.substr(0, first.find('\n'));
    need.rank.assign(static_cast<std::size_t>(n), add(capacity, 1));
    refuse("one layer alone does not fit in a rank's arena (" + first + ")");
  }
  if (need.max_rank() > capacity) refuse("a rank's arena exceeds its capacity");
  if (need.total() > available) refuse("more than the machine's available memory");
  return need;
}

std::uint64_t available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return mul(kib, 1024);
  }
  return kMax;
}

}  // namespace tspemu::app
