// Pipeline schedules as data: for each pp rank, the ordered list of actions it runs — forward F,
// full backward B, or the backward split into input-gradient I and weight-gradient W, and the
// point-to-point SEND/RECV of activations (forward) and their gradients (backward) — for GPipe,
// 1F1B, interleaved 1F1B (v virtual stages per rank) and ZB-H1. A plain library in the leaf
// module plan/: no ranks run; pipeline_check.hpp validates a table, pipeline_clock.hpp times it,
// pipeline_csv.hpp reads and writes PyTorch's CSV form of it.
//
// What
//   p pp ranks, S = p·v stages, m microbatches; stage k runs on rank k mod p (v = 1: stage k on
//   rank k). Actions use PyTorch pipelining's vocabulary and spelling (torch/distributed/
//   pipelining/schedules.py `_Action`): "1F0" stage 1 forward of microbatch 0, "2B0", "0I3",
//   "0W3", "0SEND_F1" (stage 0 sends microbatch 1's output to stage 1), "1RECV_F1" (stage 1
//   receives it), "2SEND_B0" (stage 2 sends microbatch 0's input gradient to stage 1),
//   "1RECV_B0", and the per-stage markers "0UNSHARD", "0RESHARD", "0REDUCE_GRAD".
//   The schedules, as generated (the compute order per rank; sends and recvs are then placed by
//   lower_send_recv):
//     gpipe             all m F in order, then all m B in order.
//     1f1b              w = min(p−s−1, m) warm-up F, then (F, B) pairs, then the remaining B
//                       (Megatron's PipeDream-Flush; the cap at m admits m < p, where PyTorch's
//                       Schedule1F1B refuses).
//     interleaved-1f1b  v ≥ 2; PyTorch's ScheduleInterleaved1F1B: rounds = max(1, ⌊m/p⌋),
//                       g = m / rounds microbatches per round (rounds must divide m); forward k
//                       of the rank's v·m runs chunk ⌊k/g⌋ mod v on microbatch ⌊k/(g·v)⌋·g +
//                       k mod g; warm-up min((v−1)·g + 2(p−1−r), v·m), then (F, B) pairs, the
//                       backward chunks in reverse order.
//     zb-h1             1F1B with B split into I and W (PyTorch's ScheduleInterleavedZeroBubble at
//                       v = 1): warm-up min(p−1−r, m) F; the first r (F, I) pairs run without W,
//                       after that each I is followed by the oldest pending W; the leftover W
//                       fill the drain.
//
// Requirements: p ≥ 1, m ≥ 1; v ≥ 2 for interleaved-1f1b and v = 1 for the others; for
//   interleaved-1f1b, ⌊m/p⌋ rounds (at least one) dividing m.
// Guarantees: refusal() names the rule and the values of a refused (schedule, p, m, v), and
//   make_schedule() throws std::invalid_argument with that text. A made schedule passes
//   check_schedule (pipeline_check.hpp) with sends that never block and with tspemu's mailbox
//   (4 messages in flight per ordered pair); GPipe, 1F1B and ZB-H1 also with 1 (interleaved at
//   p = 2 needs 2). None is meant for sends that block until received: each side of a stage
//   boundary sends before it consumes the other's message, as PyTorch's runtime does with isend.
//   lower_send_recv places each RECV when its SEND is made, so the receives between two ranks
//   are posted in the order the messages are sent. parse_action() accepts exactly what
//   to_string() writes.
// Cost: O(actions) = O(p·v·m) time and memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tspemu::pipeline {

// What an action does. Letters as PyTorch's _ComputationType.
enum class Op {
  forward,          // F
  backward,         // B: input and weight gradients together
  backward_input,   // I: the input gradient only (needs the next stage's I or B)
  backward_weight,  // W: the weight gradient (after the same stage's I)
  send_f,           // SEND_F: this stage's output to stage + 1
  recv_f,           // RECV_F: this stage's input from stage − 1
  send_b,           // SEND_B: this stage's input gradient to stage − 1
  recv_b,           // RECV_B: this stage's output gradient from stage + 1
  unshard,          // UNSHARD (FSDP marker; the checker ignores it)
  reshard,          // RESHARD (FSDP marker; the checker ignores it)
  reduce_grad,      // REDUCE_GRAD: the stage's gradients reduced once, after its last B or W
};

const char* op_name(Op op);  // "F", "B", "I", "W", "SEND_F", ..., "REDUCE_GRAD"
bool is_compute(Op op);      // F, B, I, W
bool is_comm(Op op);         // SEND_F, RECV_F, SEND_B, RECV_B
bool is_marker(Op op);       // UNSHARD, RESHARD, REDUCE_GRAD: no microbatch

// The activation a stage boundary carries, [B_mb, S, h] (its gradient has the same shape).
struct ActivationShape {
  std::int64_t batch = 1;
  std::int64_t seq = 1;
  std::int64_t hidden = 1;
  bool operator==(const ActivationShape&) const = default;
};
std::string to_string(const ActivationShape& s);  // "[2, 16, 64]"

struct Action {
  Op op = Op::forward;
  int stage = 0;
  int microbatch = -1;  // -1 for the markers
  // SEND/RECV: the stage at the other end (the default: SEND_F, RECV_B stage + 1; RECV_F,
  // SEND_B stage − 1), and the tensor's shape. Unused (-1, default shape) otherwise.
  int peer_stage = -1;
  ActivationShape shape;
  bool operator==(const Action&) const = default;
};

// PyTorch's spelling: stage, op letters, microbatch ("1F0", "0SEND_F3", "2REDUCE_GRAD").
std::string to_string(const Action& a);
// The other end a SEND/RECV of `op` on `stage` talks to by default.
int default_peer_stage(Op op, int stage);
// Parses to_string's spelling; a SEND/RECV gets its default peer stage and `shape`. Throws
// std::invalid_argument naming the text for anything else (OVERLAP_F_B "(…)" included).
Action parse_action(std::string_view text, const ActivationShape& shape = {});

enum class Kind { gpipe, one_f_one_b, interleaved_1f1b, zb_h1 };
const char* kind_name(Kind k);  // "gpipe", "1f1b", "interleaved-1f1b", "zb-h1"
// Throws std::invalid_argument listing the known names.
Kind parse_kind(std::string_view name);

struct ScheduleSpec {
  Kind kind = Kind::one_f_one_b;
  int ranks = 1;           // p
  int microbatches = 1;    // m
  int virtual_stages = 1;  // v: stages per rank
  ActivationShape shape;   // what every SEND/RECV carries
};

struct Schedule {
  std::string name;                          // kind_name, or "csv" for an imported table
  int ranks = 0;                             // p
  int stages = 0;                            // S
  int microbatches = 0;                      // m
  std::vector<int> stage_rank;               // stage -> rank
  std::vector<std::vector<Action>> actions;  // rank -> its actions in execution order
  bool operator==(const Schedule&) const = default;
};

// Why `spec` is refused (the rule and the values), or nullopt.
std::optional<std::string> refusal(const ScheduleSpec& spec);
// The schedule with its sends and recvs placed; throws std::invalid_argument(refusal) first.
Schedule make_schedule(const ScheduleSpec& spec);
// The compute actions only, per rank, before lower_send_recv (same refusals).
Schedule make_compute_schedule(const ScheduleSpec& spec);

// Adds the SEND/RECV of every stage boundary that crosses ranks to a compute-only schedule
// (markers kept in place), PyTorch's _add_send_recv placement: ranks take turns; a rank's next
// compute action is placed once its input is local or its RECV is placed; placing an action
// places its SEND right after it and the matching RECV at the end of the receiver's list.
// Throws std::invalid_argument when the table already has SEND/RECV, or when no rank can place
// its next action (the compute order itself deadlocks), naming each rank's stuck action.
Schedule lower_send_recv(const Schedule& compute_only, const ActivationShape& shape);

// The compute actions of `s` (SEND/RECV removed, markers kept).
Schedule compute_only(const Schedule& s);

}  // namespace tspemu::pipeline
