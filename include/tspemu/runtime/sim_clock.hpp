// SimClockModel: a simple cost model giving every traced event a simulated duration, so a trace
// also shows an ESTIMATE of the schedule on a GPU cluster.
//
// What: compute spans (TraceSpan with a FLOP count) cost flops / peak_flops; a message costs
// alpha + bytes / beta; collectives cost the ring (or tree) formulas below over the same link.
// Each rank keeps a simulated clock: a collective starts when its last member arrives (the
// members' clocks travel in the mailbox) and ends after its modelled cost; a receive ends no
// earlier than its message's arrival (sender's clock + alpha + bytes / beta). Work outside
// TraceSpans, and everything the model leaves out (overlap of compute and copies, contention,
// kernel launch, memory bandwidth), costs nothing. It is an estimate, not a measurement, and
// describe() names the parameters that produced it.
// Costs, n ranks, N = the call's bytes on this rank (count x element size):
//   all_gather(v), reduce_scatter               (n-1)(alpha + N/beta)      (N: one rank's block)
//   all_to_all                                  (n-1)(alpha + N/(n beta))  (N: the whole buffer)
//   all_reduce                                  2(n-1)(alpha + N/(n beta))
//   broadcast, reduce                           ceil(log2 n)(alpha + N/beta)
//   barrier, split                              ceil(log2 n) alpha
//   send/recv                                   alpha + N/beta
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tspemu/runtime/counters.hpp"

namespace tspemu {

struct SimClockModel {
  std::string name = "custom";
  double peak_flops = 1e15;     // FLOP/s of one device
  double alpha_s = 2e-6;        // latency of one message, seconds
  double beta_bytes_s = 150e9;  // bandwidth of one link, bytes/s (each direction)

  // A node of 8 NVLink-connected GPUs (H100-class): 989 TFLOP/s dense bf16, ~2 us, 450 GB/s.
  static SimClockModel nvlink_node();
  // GPUs across nodes on a 400 Gb/s network-class link: same peak, ~10 us, 50 GB/s.
  static SimClockModel network();
  // "nvlink" or "network"; nullopt for other names.
  static std::optional<SimClockModel> preset(std::string_view name);

  double compute_seconds(double flops) const { return flops / peak_flops; }
  double message_seconds(std::uint64_t bytes) const {
    return alpha_s + static_cast<double>(bytes) / beta_bytes_s;
  }
  // The call's modelled duration; `bytes` is the call's count x element size on this rank (for
  // all_gather the rank's block, for reduce_scatter the whole input), n the group size.
  double collective_seconds(CollectiveKind kind, std::uint64_t bytes, int n) const;
  // "estimate (model nvlink: peak 989 TFLOP/s, alpha 2 us, beta 450 GB/s)".
  std::string describe() const;
};

}  // namespace tspemu
