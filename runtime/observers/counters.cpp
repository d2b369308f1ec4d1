#include "tspemu/runtime/counters.hpp"

namespace tspemu {

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
