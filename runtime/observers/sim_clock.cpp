#include "tspemu/runtime/sim_clock.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include "../world/op_hooks.hpp"
#include "../world/world_state.hpp"

namespace tspemu {

namespace {

// Device and link constants, cited once here (sim_clock.hpp); the planner's DeviceModel
// (plan/cost_model.hpp) is built from the presets below.
constexpr double kH100PeakBf16 = 989e12;       // H100 SXM datasheet, dense bf16
constexpr double kNvlinkBeta = 450e9;          // NVLink 4: 900 GB/s bidirectional per GPU
constexpr double kMi300xPeakBf16 = 1307.4e12;  // MI300X datasheet, dense bf16
constexpr double kInfinityFabricBeta = 448e9;  // 7 links x 64 GB/s per direction
constexpr double kNic400GbBeta = 50e9;         // one 400 Gb/s NIC per GPU
constexpr double kIntraAlpha = 2e-6;           // assumption: NVLink / Infinity Fabric message
constexpr double kInterAlpha = 10e-6;          // assumption: RDMA message across nodes
constexpr double kAssumedMfu = 0.4;            // assumption, as the planner's default
constexpr int kGpusPerNode = 8;                // HGX H100, MI300X platform

[[noreturn]] void reject(const SimClockModel& m, const std::string& why) {
  throw std::invalid_argument("simulated clock model " + m.name + ": " + why);
}

// A device of `peak` FLOP/s on an intra-node link of `intra_beta`; one link level unless
// gpus_per_node > 0, then the 400 Gb/s NIC between nodes.
SimClockModel device(const char* name, double peak, double mfu, double intra_alpha,
                     double intra_beta, int gpus_per_node) {
  SimClockModel m;
  m.name = name;
  m.peak_flops = peak;
  m.mfu = mfu;
  m.alpha_s = intra_alpha;
  m.beta_bytes_s = intra_beta;
  m.gpus_per_node = gpus_per_node;
  m.inter_alpha_s = kInterAlpha;
  m.inter_beta_bytes_s = kNic400GbBeta;
  return m;
}

}  // namespace

SimClockModel SimClockModel::nvlink_node() {
  return device("nvlink", kH100PeakBf16, 1.0, kIntraAlpha, kNvlinkBeta, 0);
}

SimClockModel SimClockModel::network() {
  return device("network", kH100PeakBf16, 1.0, kInterAlpha, kNic400GbBeta, 0);
}

SimClockModel SimClockModel::h100_nvlink() {
  return device("h100-nvlink", kH100PeakBf16, kAssumedMfu, kIntraAlpha, kNvlinkBeta, kGpusPerNode);
}

SimClockModel SimClockModel::mi300x_if() {
  return device("mi300x-if", kMi300xPeakBf16, kAssumedMfu, kIntraAlpha, kInfinityFabricBeta,
                kGpusPerNode);
}

std::optional<SimClockModel> SimClockModel::preset(std::string_view name) {
  if (name == "nvlink") return nvlink_node();
  if (name == "network") return network();
  if (name == "h100-nvlink") return h100_nvlink();
  if (name == "mi300x-if") return mi300x_if();
  return std::nullopt;
}

void SimClockModel::validate(int ranks) const {
  auto num = [](double v) { return std::to_string(v); };
  if (!(peak_flops > 0)) reject(*this, "peak_flops=" + num(peak_flops) + " must be > 0");
  if (!(mfu > 0 && mfu <= 1)) reject(*this, "mfu=" + num(mfu) + " must be in (0, 1]");
  if (!(beta_bytes_s > 0) || !(inter_beta_bytes_s > 0))
    reject(*this, "beta=" + num(beta_bytes_s) + ", inter beta=" + num(inter_beta_bytes_s) +
                      " must be > 0");
  if (!(alpha_s >= 0) || !(inter_alpha_s >= 0))
    reject(*this,
           "alpha=" + num(alpha_s) + ", inter alpha=" + num(inter_alpha_s) + " must be >= 0");
  if (gpus_per_node < 0)
    reject(*this, "gpus_per_node=" + std::to_string(gpus_per_node) + " must be >= 0");
  if (node_of_rank.empty()) return;
  if (static_cast<int>(node_of_rank.size()) != ranks)
    reject(*this, "node_of_rank has " + std::to_string(node_of_rank.size()) +
                      " entries for ranks=" + std::to_string(ranks));
  for (std::size_t r = 0; r < node_of_rank.size(); ++r)
    if (node_of_rank[r] < 0)
      reject(*this, "node_of_rank[" + std::to_string(r) + "]=" + std::to_string(node_of_rank[r]) +
                        " must be >= 0");
}

int SimClockModel::node_of(int world_rank) const {
  if (!node_of_rank.empty()) return node_of_rank[static_cast<std::size_t>(world_rank)];
  return gpus_per_node > 0 ? world_rank / gpus_per_node : 0;
}

bool SimClockModel::spans_nodes(const std::vector<int>& world_ranks) const {
  for (int r : world_ranks)
    if (node_of(r) != node_of(world_ranks.front())) return true;
  return false;
}

double SimClockModel::message_seconds(std::uint64_t bytes, bool across_nodes) const {
  const double alpha = across_nodes ? inter_alpha_s : alpha_s;
  const double beta = across_nodes ? inter_beta_bytes_s : beta_bytes_s;
  return alpha + static_cast<double>(bytes) / beta;
}

double SimClockModel::latency_steps(CollectiveKind kind, int n) {
  if (n <= 1) return 0;
  switch (kind) {
    case CollectiveKind::all_reduce:
      return 2.0 * (n - 1);
    case CollectiveKind::barrier:
    case CollectiveKind::split:
      return std::ceil(std::log2(static_cast<double>(n)));
    case CollectiveKind::send:
      return 1;
    case CollectiveKind::recv:
      return 0;
    default:
      return n - 1.0;
  }
}

double SimClockModel::collective_seconds(CollectiveKind kind, std::uint64_t bytes, int n,
                                         bool across_nodes) const {
  if (n <= 1) return 0;
  const double alpha = across_nodes ? inter_alpha_s : alpha_s;
  const double beta = across_nodes ? inter_beta_bytes_s : beta_bytes_s;
  const double b = static_cast<double>(bytes);
  const double steps = static_cast<double>(n - 1);
  switch (kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::all_gatherv:
    case CollectiveKind::reduce_scatter:
      return steps * (alpha + b / beta);  // the call's count is one rank's block
    case CollectiveKind::all_to_all:
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce:
      return steps * (alpha + b / n / beta);  // the call's count is the whole buffer
    case CollectiveKind::all_reduce:
      return 2 * steps * (alpha + b / n / beta);
    case CollectiveKind::barrier:
    case CollectiveKind::split:
      return latency_steps(kind, n) * alpha;
    case CollectiveKind::send:
    case CollectiveKind::recv:
      return alpha + b / beta;  // a message: the hop's own cost, whichever end asks
  }
  return 0;
}

std::string SimClockModel::describe() const {
  char device[96], b[400];
  if (mfu == 1)
    std::snprintf(device, sizeof device, "peak %.0f TFLOP/s", peak_flops * 1e-12);
  else
    std::snprintf(device, sizeof device, "peak %.0f TFLOP/s x MFU %.2f", peak_flops * 1e-12, mfu);
  if (gpus_per_node == 0 && node_of_rank.empty())
    std::snprintf(b, sizeof b,
                  "estimate from a cost model, not a measurement (model %s: %s, alpha %.1f us, "
                  "beta %.0f GB/s)",
                  name.c_str(), device, alpha_s * 1e6, beta_bytes_s * 1e-9);
  else
    std::snprintf(b, sizeof b,
                  "estimate from a cost model, not a measurement (model %s: %s, %s per node, "
                  "intra alpha %.1f us beta %.0f GB/s, inter alpha %.1f us beta %.0f GB/s; a "
                  "ring spanning nodes runs at the inter-node link)",
                  name.c_str(), device,
                  node_of_rank.empty() ? std::to_string(gpus_per_node).c_str() : "mapped",
                  alpha_s * 1e6, beta_bytes_s * 1e-9, inter_alpha_s * 1e6,
                  inter_beta_bytes_s * 1e-9);
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
      op.sim_arrival_ns =
          self.sim.now_ns() + sim_ns_of(sim->message_seconds(
                                  op.bytes, sim->node_of(self.rank) != sim->node_of(op.peer)));
  }
  void on_meet(RankState& self, OpInfo& op, const MemberHeaders& headers) override {
    const SimClockModel* sim = sim_model(self);
    if (sim == nullptr) return;
    if (op.nonblocking) {
      // Charged by its handle: issued on the communication stream, waited at wait()
      // (nonblocking.cpp).
      op.sim_begin_ns = op.sim_end_ns = self.sim.now_ns();
      return;
    }
    std::int64_t start = 0;
    for (int r = 0; r < headers.size(); ++r) start = std::max(start, headers[r].sim_ns);
    const std::int64_t cost = sim_ns_of(
        sim->collective_seconds(op.collective, op.bytes, op.members,
                                op.group != nullptr && sim->spans_nodes(op.group->world_ranks)));
    // Blocking: the compute stream waits from its arrival to the end (exposed).
    const SimStreams::Transfer t = self.sim.blocking(start, cost);
    op.sim_begin_ns = t.begin_ns;
    op.sim_end_ns = t.end_ns;
  }
  void on_end(RankState& self, OpInfo& op, bool ok) override {
    if (sim_model(self) == nullptr || !ok) return;
    switch (op.kind) {
      case OpInfo::Kind::send:
      case OpInfo::Kind::send_wait:
        // The copy does not hold the sender.
        op.sim_begin_ns = op.sim_end_ns = self.sim.now_ns();
        return;
      case OpInfo::Kind::recv:
        op.sim_begin_ns = self.sim.now_ns();
        op.sim_end_ns = self.sim.blocking(op.sim_arrival_ns, 0).end_ns;  // waits: exposed
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
