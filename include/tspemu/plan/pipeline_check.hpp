// Static pipeline-schedule checker: validates every rank's action list (pipeline_schedule.hpp)
// without running anything, and names the first problem by rank, action index, stage and
// microbatch — the hangs and silent mismatches users hit (mismatched send/recv order and shapes,
// a W before its B, a microbatch never run) found before any rank starts.
//
// What: the checks, in this order (the first failing one is reported):
//   1. the table: p rows, every stage mapped to a rank in [0, p);
//   2. each action: its stage exists and runs on this row's rank; its microbatch is in [0, m);
//      a SEND/RECV talks to the adjacent stage in its direction (SEND_F to stage + 1, SEND_B to
//      stage − 1, RECV_F from stage − 1, RECV_B from stage + 1) and that stage is on another rank;
//   3. exactly once: every (stage, microbatch) runs one F, and either one B or one I and one W;
//      no SEND/RECV/REDUCE_GRAD twice;
//   4. pairing: every SEND has its RECV on the peer's rank and every RECV its SEND;
//   5. order on each rank: F after its input (the previous stage's F when that stage is local,
//      else this stage's RECV_F); B or I after this stage's F and after the output gradient (the
//      next stage's B or I when local, else RECV_B); W after its I; SEND_F after its F, SEND_B
//      after its B or I; REDUCE_GRAD after all of the stage's B and W;
//   6. matching: a RECV is posted without blocking (irecv) and messages between a pair of ranks
//      match in order (per-pair FIFO, no tags, as tspemu's send/recv and NCCL), so the k-th RECV
//      on b from a takes the k-th SEND from a to b: same direction, stages, microbatch, shape;
//   7. a dry run: the compute action that consumes a message (F its RECV_F, B or I its RECV_B)
//      waits until it is sent; a SEND blocks while `sends_in_flight` earlier sends to the same
//      peer are unconsumed (0: until its own message is consumed, a blocking send); nothing else
//      blocks. No rank can move while some are unfinished: a deadlock, every stuck rank named
//      with the action it waits at, what it waits for and where that rank stands.
// Requirements: none (any table is judged; a malformed one is reported, never a crash or hang).
// Guarantees: nullopt iff all seven pass. An issue names its rank (−1 for the table), the action's
//   index in the rank's list (−1 when the problem is a missing action), its stage and microbatch
//   (−1 when not one), and a message carrying all of them in words.
// Cost: O(actions) time and O(S·m + p²) memory; the dry run visits each action once.
#pragma once

#include <optional>
#include <string>

#include "tspemu/plan/pipeline_schedule.hpp"

namespace tspemu::pipeline {

struct CheckOptions {
  // A SEND blocks while this many earlier sends from its rank to the same peer are unconsumed
  // (tspemu's mailbox admits 4 per ordered pair); 0: every SEND blocks until it is consumed.
  int sends_in_flight = 4;
};

struct ScheduleIssue {
  int rank = -1;
  int index = -1;
  int stage = -1;
  int microbatch = -1;
  std::string message;
};

std::optional<ScheduleIssue> check_schedule(const Schedule& s, const CheckOptions& opt = {});
// Throws std::invalid_argument with the issue's message when check_schedule finds one.
void require_valid(const Schedule& s, const CheckOptions& opt = {});

}  // namespace tspemu::pipeline
