#include "tspemu/runtime/counters.hpp"

namespace tspemu {

const char* collective_name(CollectiveKind k) {
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

std::uint64_t TrafficCounters::total_sent() const {
  std::uint64_t s = 0;
  for (const auto& e : by_kind) s += e.bytes_sent;
  return s;
}

std::uint64_t TrafficCounters::total_received() const {
  std::uint64_t s = 0;
  for (const auto& e : by_kind) s += e.bytes_received;
  return s;
}

}  // namespace tspemu
