// Trace: per-rank event recording and its export as Chrome trace JSON (Perfetto, chrome://tracing).
//
// What: with WorldOptions::trace on, every rank records its collectives (kind, sequence number,
// group, bytes, root), its sends and receives (peer, bytes, and a flow id joining each send to its
// receive), its TraceSpans (GEMM, attention: a name and a FLOP count) and its arena's bytes in use
// (a counter sample at every allocation and release). With WorldOptions::sim_clock set, every
// event also gets a simulated begin and end (sim_clock.hpp).
// Requirements: a rank's buffer is written by that rank's thread only; World::trace() is read
// between runs, not during one (World::run's completion publishes the buffers). TraceSpan names
// must outlive the trace (string literals).
// Guarantees: no locks and no allocation while recording: each rank appends to its own buffer,
// allocated once with WorldOptions::trace_capacity events; events past the capacity are dropped
// and counted (dropped()). Tracing off costs one pointer test per operation. Recording continues
// across runs until clear().
// Export (write_chrome_json): one process per rank ("rank r", a thread "ops" with one slice per
// event — blocking calls nest, so slices nest — and an "arena bytes" counter track), flow arrows
// ("s" at the send, "f" at the end of its receive) with matching ids, and with a simulated clock
// one more process per rank "rank r (simulated)" whose slices are the model's estimate, labelled
// with the model's parameters. Timestamps in microseconds since the world was made.
//
// Example:
//   tspemu::World world({.ranks = 4, .trace = true});
//   world.run(schedule);
//   world.trace().write_chrome_json("schedule.json");  // open in https://ui.perfetto.dev
#pragma once

#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "tspemu/core/compute_span.hpp"
#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/elapsed_clock.hpp"

namespace tspemu {

namespace detail {
struct WorldShared;
struct RankState;
}  // namespace detail

struct TraceEvent {
  enum class Type : std::uint8_t { collective, send, recv, span, counter };
  Type type = Type::span;
  const char* name = "";       // collective kind, "send"/"recv", the span's name, "arena bytes"
  std::uint64_t seq = 0;       // collective or message number
  std::uint64_t group_id = 0;  // Trace::group_name(group_id)
  int peer = -1;               // world rank (send: destination, recv: source)
  int root = -1;               // group rank of the root
  std::uint64_t bytes = 0;     // count x element size; the counter's value for Type::counter
  double flops = 0;            // spans
  std::uint64_t flow = 0;      // send/recv: the message's flow id (0: none)
  std::int64_t begin_ns = 0;   // since the world was made
  std::int64_t end_ns = 0;
  std::int64_t sim_begin_ns = -1;  // simulated clock, -1 without one
  std::int64_t sim_end_ns = -1;
};

// One rank's bounded event buffer.
class RankTrace {
 public:
  // `clock`: the world's (its events share one time base).
  RankTrace(std::size_t capacity, ElapsedClock clock) : clock_(clock) { events_.reserve(capacity); }
  std::int64_t now_ns() const { return clock_.now_ns(); }
  void counter(const char* name, std::uint64_t value) noexcept {
    const std::int64_t t = now_ns();
    record(TraceEvent{TraceEvent::Type::counter, name, 0, 0, -1, -1, value, 0, 0, t, t, -1, -1});
  }
  void record(const TraceEvent& e) noexcept {
    if (events_.size() < events_.capacity())
      events_.push_back(e);  // within the reserved capacity: never allocates
    else
      ++dropped_;
  }
  std::span<const TraceEvent> events() const { return events_; }
  std::uint64_t dropped() const { return dropped_; }
  void clear() {
    events_.clear();
    dropped_ = 0;
  }
  // The next flow id of this rank's sends: unique in the world (rank in the top bits) and below
  // 2^53 so JSON readers keep it exact.
  std::uint64_t next_flow(int rank) { return (static_cast<std::uint64_t>(rank) << 40) | ++flows_; }

 private:
  std::vector<TraceEvent> events_;
  std::uint64_t dropped_ = 0;
  std::uint64_t flows_ = 0;
  ElapsedClock clock_;
};

// The world's trace, between runs (World::trace()).
class Trace {
 public:
  explicit Trace(detail::WorldShared* w) : w_(w) {}
  bool enabled() const;
  int ranks() const;
  std::span<const TraceEvent> events(int rank) const;
  std::uint64_t dropped(int rank) const;
  std::string group_name(std::uint64_t group_id) const;
  void clear();
  void write_chrome_json(std::ostream& out) const;
  // Whole or not at all (core/atomic_file.hpp); throws FileWriteError naming the path.
  void write_chrome_json(const std::string& path) const;

 private:
  detail::WorldShared* w_;
};

// RAII span of user work on the calling rank (a GEMM, an attention block): recorded when tracing
// is on, and, with a simulated clock, charged flops / peak on the rank's simulated time. Costs
// nothing but a pointer test when tracing is off. The reference kernels open ComputeSpans
// (core/compute_span.hpp) that reach the same rank without a Comm; nested spans are charged once:
// a span ends at max(its begin + its own FLOPs, the clock after what ran inside it).
class TraceSpan {
 public:
  TraceSpan(const Comm& comm, const char* name, double flops = 0);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  detail::RankState* self_ = nullptr;  // null when tracing is off
  const char* name_;
  double flops_;
  ComputeObserver::Token token_{};
};

}  // namespace tspemu
