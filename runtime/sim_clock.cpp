#include "tspemu/runtime/sim_clock.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include "state.hpp"

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

namespace tspemu::detail {

namespace {

// Collectives start when their last member arrives (every member computes the same start and end
// from the same entry clocks in the call headers); a message arrives message_seconds after its
// send; a receive ends no earlier than its message arrives.
class SimClockObserver final : public Observer {
 public:
  unsigned hooks(const WorldOptions& opts) const override {
    return opts.sim_clock ? kHookBegin | kHookMeet | kHookEnd : 0u;
  }
  void on_begin(RankState& self, OpInfo& op) override {
    const SimClockModel* sim = sim_model(self);
    if (sim != nullptr && op.kind == OpInfo::Kind::send)
      op.sim_arrival_ns = self.sim_ns + sim_ns_of(sim->message_seconds(op.bytes));
  }
  void on_meet(RankState& self, OpInfo& op, const MemberHeaders& headers) override {
    const SimClockModel* sim = sim_model(self);
    if (sim == nullptr) return;
    std::int64_t start = 0;
    for (int r = 0; r < headers.size(); ++r) start = std::max(start, headers[r].sim_ns);
    op.sim_begin_ns = start;
    op.sim_end_ns = start + sim_ns_of(sim->collective_seconds(op.collective, op.bytes, op.members));
    self.sim_ns = op.sim_end_ns;
  }
  void on_end(RankState& self, OpInfo& op, bool ok) override {
    if (sim_model(self) == nullptr || !ok) return;
    switch (op.kind) {
      case OpInfo::Kind::send:
      case OpInfo::Kind::send_wait:
        // The copy does not hold the sender.
        op.sim_begin_ns = op.sim_end_ns = self.sim_ns;
        return;
      case OpInfo::Kind::recv:
        op.sim_begin_ns = self.sim_ns;
        self.sim_ns = std::max(self.sim_ns, op.sim_arrival_ns);
        op.sim_end_ns = self.sim_ns;
        return;
      default:
        return;
    }
  }
};

}  // namespace

std::unique_ptr<Observer> make_sim_clock_observer() {
  return std::make_unique<SimClockObserver>();
}

}  // namespace tspemu::detail
