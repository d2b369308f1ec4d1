// Per-rank traffic counters, exact, per collective kind.
//
// Bytes are logical payload crossing this rank's boundary (self copies are not counted):
//   broadcast        root sends (n-1)·N, every other rank receives N
//   all_gather(v)    each rank receives the n-1 other blocks and sends its block to n-1 ranks
//   reduce_scatter   input n·N: each rank receives the n-1 other ranks' block r, sends n-1 blocks
//   all_reduce       reduce_scatter + all_gather over balanced chunks: 2(n-1)/n·N when n | N
//   reduce           root receives (n-1)·N, every other rank sends N
//   all_to_all       each rank sends and receives (n-1) blocks
//   send / recv      the message
// These equal the ring cost model's per-rank volumes (TSP-NOTES.md) except broadcast, which here
// is a direct read of the root's buffer by every rank (a tree or ring would spread the root's
// (n-1)·N over the ranks).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tspemu {

enum class CollectiveKind : std::uint8_t {
  broadcast,
  all_gather,
  all_gatherv,
  reduce_scatter,
  all_reduce,
  reduce,
  all_to_all,
  barrier,
  split,
  send,
  recv,
};
inline constexpr std::size_t kCollectiveKindCount = 11;
// Inline: every collective call names itself for its wait diagnoses and flight record.
constexpr const char* collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::all_gatherv:
      return "all_gatherv";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::reduce:
      return "reduce";
    case CollectiveKind::all_to_all:
      return "all_to_all";
    case CollectiveKind::barrier:
      return "barrier";
    case CollectiveKind::split:
      return "split";
    case CollectiveKind::send:
      return "send";
    case CollectiveKind::recv:
      return "recv";
  }
  return "?";
}

// The one description of traffic: what a rank's collectives moved (World::counters), and what the
// planner's closed forms predict a rank moves (plan/cost_model.hpp), so the two compare with ==.
// A value type: + adds two passes or parts, * scales by an integer (L layers of one layer).
struct TrafficCounters {
  struct Entry {
    std::uint64_t calls = 0;
    std::uint64_t bytes_sent = 0;
    std::uint64_t bytes_received = 0;
    friend bool operator==(const Entry&, const Entry&) = default;
  };
  std::array<Entry, kCollectiveKindCount> by_kind{};

  Entry& operator[](CollectiveKind k) { return by_kind[static_cast<std::size_t>(k)]; }
  const Entry& operator[](CollectiveKind k) const { return by_kind[static_cast<std::size_t>(k)]; }
  std::uint64_t total_sent() const;
  std::uint64_t total_received() const;
  void clear() { by_kind = {}; }
  // Adds n calls of kind k, each sending `sent` and receiving `received` bytes.
  void add(CollectiveKind k, std::uint64_t n, std::uint64_t sent, std::uint64_t received) {
    Entry& e = (*this)[k];
    e.calls += n;
    e.bytes_sent += n * sent;
    e.bytes_received += n * received;
  }

  friend bool operator==(const TrafficCounters&, const TrafficCounters&) = default;
  TrafficCounters& operator+=(const TrafficCounters& o) {
    for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
      by_kind[k].calls += o.by_kind[k].calls;
      by_kind[k].bytes_sent += o.by_kind[k].bytes_sent;
      by_kind[k].bytes_received += o.by_kind[k].bytes_received;
    }
    return *this;
  }
  friend TrafficCounters operator+(TrafficCounters a, const TrafficCounters& b) { return a += b; }
  // Every call and byte count times n.
  friend TrafficCounters operator*(TrafficCounters a, std::uint64_t n) {
    for (Entry& e : a.by_kind) e = {e.calls * n, e.bytes_sent * n, e.bytes_received * n};
    return a;
  }
  friend TrafficCounters operator*(std::uint64_t n, const TrafficCounters& a) { return a * n; }
};

}  // namespace tspemu
