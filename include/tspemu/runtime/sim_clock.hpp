// SimClockModel: a cost model giving every traced event a simulated duration, so a trace also
// shows an ESTIMATE of the schedule on a GPU cluster of two link levels (inside a node, between
// nodes).
//
// What: compute spans (TraceSpan with a FLOP count) cost flops / (peak_flops · mfu); a message
// costs alpha + bytes / beta of the link between its two ranks; a collective costs the ring
// formulas below. Each rank keeps a simulated clock: a collective starts when its last member
// arrives (the members' clocks travel in the mailbox) and ends after its modelled cost; a receive
// ends no earlier than its message's arrival (sender's clock + alpha + bytes / beta). Work outside
// TraceSpans, and everything the model leaves out (contention, kernel launch, memory bandwidth),
// costs nothing. It is an estimate, not a measurement, and describe() names the parameters.
// Topology: ranks sit on nodes of gpus_per_node devices, contiguously (node = rank /
// gpus_per_node) or by node_of_rank; gpus_per_node 0 puts every rank on one node. Two ranks on one
// node talk over the intra-node link (alpha_s, beta_bytes_s), else over the inter-node link
// (inter_alpha_s, inter_beta_bytes_s: one NIC per device).
// Algorithm convention (the same as the planner's cost model, plan/cost_model.hpp "paper
// convention"): every collective is a ring over its group's ranks in group order; a step moves
// one block between neighbours and lasts as long as the slowest hop, so a group with members on
// two nodes is charged the inter-node link for every step. n ranks, N = the call's bytes on this
// rank (count x element size), per-rank bytes (n-1)/n of the data, (n-1) steps (all_reduce 2(n-1)):
//   all_gather(v), reduce_scatter               (n-1)(alpha + N/beta)      (N: one rank's block)
//   all_to_all                                  (n-1)(alpha + N/(n beta))  (N: the whole buffer)
//   all_reduce                                  2(n-1)(alpha + N/(n beta)) (reduce-scatter +
//   gather) broadcast, reduce                           (n-1)(alpha + N/(n beta))  (N cut in n
//   chunks,
//                                               pipelined round the ring: scatter + all-gather)
//   barrier, split                              ceil(log2 n) alpha         (dissemination; no
//   bytes) send/recv                                   alpha + N/beta
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tspemu/runtime/counters.hpp"

namespace tspemu {

struct SimClockModel {
  std::string name = "custom";
  double peak_flops = 1e15;      // FLOP/s of one device
  double mfu = 1.0;              // fraction of peak_flops the compute spans reach, in (0, 1]
  double alpha_s = 2e-6;         // intra-node link: latency of one message, seconds
  double beta_bytes_s = 150e9;   // intra-node link: bandwidth per device, bytes/s (each direction)
  int gpus_per_node = 0;         // devices per node; 0: every rank on one node
  double inter_alpha_s = 10e-6;  // inter-node link latency, seconds
  double inter_beta_bytes_s = 50e9;  // inter-node bandwidth per device (its NIC), bytes/s
  std::vector<int> node_of_rank;     // world rank -> node; empty: contiguous by gpus_per_node

  // One node of H100-class GPUs, one link level: 989 TFLOP/s dense bf16, ~2 us, 450 GB/s.
  static SimClockModel nvlink_node();
  // GPUs across nodes on a 400 Gb/s network-class link: same peak, ~10 us, 50 GB/s.
  static SimClockModel network();
  // NVIDIA H100 SXM (datasheet): 989 TFLOP/s dense bf16; NVLink 4, 18 links = 900 GB/s
  // bidirectional, 450 GB/s per direction; 8 per node (DGX/HGX H100); one ConnectX-7 400 Gb/s NIC
  // per GPU = 50 GB/s. MFU 0.4 and latencies 2 us (NVLink) / 10 us (network): stated assumptions.
  static SimClockModel h100_nvlink();
  // AMD Instinct MI300X (datasheet): 1307.4 TFLOP/s dense bf16; 7 Infinity Fabric links of
  // 64 GB/s per direction = 448 GB/s per device, fully connected node of 8 (MI300X platform);
  // one 400 Gb/s NIC per GPU = 50 GB/s (TSP-NOTES.md gives the paper's 1024-GPU MI300X cluster
  // but no NIC figure; 400 Gb/s per GPU is the MI300X platform's reference design — an
  // assumption). MFU 0.4 and latencies 2 us / 10 us: stated assumptions, as h100_nvlink.
  static SimClockModel mi300x_if();
  // "nvlink", "network", "h100-nvlink" or "mi300x-if"; nullopt for other names.
  static std::optional<SimClockModel> preset(std::string_view name);
  static constexpr const char* kPresetNames = "nvlink, network, h100-nvlink or mi300x-if";

  // Throws std::invalid_argument naming the field and value unless peak, beta > 0, mfu in (0, 1],
  // alpha >= 0, gpus_per_node >= 0 and node_of_rank is empty or holds ranks entries >= 0.
  void validate(int ranks) const;

  int node_of(int world_rank) const;
  // Whether the ranks sit on more than one node.
  bool spans_nodes(const std::vector<int>& world_ranks) const;

  // Latency steps of one call on n ranks by the convention above (send: 1 step, recv: 0 — a
  // message's one hop is charged once); the planner's cost model counts latency with it.
  static double latency_steps(CollectiveKind kind, int n);

  double compute_seconds(double flops) const { return flops / (peak_flops * mfu); }
  double message_seconds(std::uint64_t bytes, bool across_nodes = false) const;
  // The call's modelled duration; `bytes` is the call's count x element size on this rank (for
  // all_gather and reduce_scatter one rank's block, else the whole buffer), n the group size,
  // across_nodes whether the group spans nodes (the ring's slowest hop is then inter-node).
  double collective_seconds(CollectiveKind kind, std::uint64_t bytes, int n,
                            bool across_nodes = false) const;
  // "estimate (model mi300x-if: peak 1307 TFLOP/s x MFU 0.40, 8 per node, intra alpha 2.0 us
  // beta 448 GB/s, inter alpha 10.0 us beta 50 GB/s)".
  std::string describe() const;
};

}  // namespace tspemu
