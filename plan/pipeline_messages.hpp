// Internal to plan/ (pipeline_check.cpp, pipeline_clock.cpp): which SEND each RECV of a pipeline
// schedule takes and which RECV each compute action consumes.
//
// What: RECVs are posted without blocking (irecv) and sends without waiting for the receiver
//   (isend), so the k-th RECV on rank b from rank a, in b's list order, takes the k-th SEND from a
//   to b in a's list order (per-pair FIFO, no tags). The compute action that needs a remote input
//   (F after RECV_F of its stage and microbatch; B or I after RECV_B) waits for that message.
// Requirements: the schedule passed pipeline_check.cpp's checks 1–5 (fields, exactly once,
//   pairing, order), so every SEND has one RECV and every consumer one earlier RECV.
// Cost: O(actions + S·m).
#pragma once

#include <vector>

#include "tspemu/plan/pipeline_schedule.hpp"

namespace tspemu::pipeline::detail {

struct End {
  int rank = -1;
  int index = -1;
};

struct Messages {
  std::vector<std::vector<End>> other_end;  // rank -> action -> the matched SEND/RECV, or {-1,-1}
  std::vector<std::vector<int>> consumes;   // rank -> action -> the RECV it waits for, or -1
};

Messages link_messages(const Schedule& s);

}  // namespace tspemu::pipeline::detail
