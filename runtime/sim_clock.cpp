#include "tspemu/runtime/sim_clock.hpp"

#include <cmath>
#include <cstdio>

namespace tspemu {

SimClockModel SimClockModel::nvlink_node() {
  return {"nvlink", 989e12, 2e-6, 450e9};
}

SimClockModel SimClockModel::network() {
  return {"network", 989e12, 10e-6, 50e9};
}

std::optional<SimClockModel> SimClockModel::preset(std::string_view name) {
  if (name == "nvlink") return nvlink_node();
  if (name == "network") return network();
  return std::nullopt;
}

double SimClockModel::collective_seconds(CollectiveKind kind, std::uint64_t bytes, int n) const {
  if (n <= 1) return 0;
  const double b = static_cast<double>(bytes);
  const double steps = static_cast<double>(n - 1);
  const double tree = std::ceil(std::log2(static_cast<double>(n)));
  switch (kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::all_gatherv:
    case CollectiveKind::reduce_scatter:
      return steps * message_seconds(bytes);  // the call's count is one rank's block
    case CollectiveKind::all_to_all:
      return steps * (alpha_s + b / n / beta_bytes_s);  // the call's count is the whole buffer
    case CollectiveKind::all_reduce:
      return 2 * steps * (alpha_s + b / n / beta_bytes_s);
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce:
      return tree * message_seconds(bytes);
    case CollectiveKind::barrier:
    case CollectiveKind::split:
      return tree * alpha_s;
    case CollectiveKind::send:
    case CollectiveKind::recv:
      return message_seconds(bytes);
  }
  return 0;
}

std::string SimClockModel::describe() const {
  char b[160];
  std::snprintf(b, sizeof b,
                "estimate from a cost model, not a measurement (model %s: peak %.0f TFLOP/s, "
                "alpha %.1f us, beta %.0f GB/s)",
                name.c_str(), peak_flops * 1e-12, alpha_s * 1e6, beta_bytes_s * 1e-9);
  return b;
}

}  // namespace tspemu
