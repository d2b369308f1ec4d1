// One hop of a ring of ranks (private to tspemu::tsp; ring_attention.cpp's training core and
// sequence_prefill.cpp's ring pass-KV prefill): send a block to the next rank and receive the
// previous rank's, posted before a step's compute and completed after it, so the transfer
// overlaps the compute.
//
// Requirements: every member of `comm` posts one hop per ring step, in the same order; `out` and
//   `in` do not overlap and stay alive until wait(); in.size() is what the previous rank sends
//   (blocks may differ in size from rank to rank).
// Guarantees: wait() returns once `in` holds the previous rank's block and `out` may be reused;
//   counted as one send and one recv (runtime/send_recv.hpp).
#pragma once

#include <span>

#include "tspemu/runtime/send_recv.hpp"

namespace tspemu::tsp::detail {

template <class T>
class RingHop {
 public:
  RingHop(Comm& comm, std::span<const T> out, std::span<T> in)
      : send_(isend<T>(comm, out, (comm.rank() + 1) % comm.size())),
        recv_(irecv<T>(comm, in, (comm.rank() + comm.size() - 1) % comm.size())) {}
  void wait() {
    recv_.wait();
    send_.wait();
  }

 private:
  SendHandle send_;
  RecvHandle recv_;
};

}  // namespace tspemu::tsp::detail
