// Call: one collective call #seq of a Comm on this rank, the handle the algorithms in
// runtime/collectives/ are written against (the transport's verbs, transport.hpp), plus the rank
// services those algorithms need (traffic counters, failures, the observers of point-to-point
// messages) without seeing the world's state.
//
// Requirements: one Call at a time per Comm, on the rank's own thread; the verbs' rules are the
// transport's (transport.hpp).
// Guarantees: the constructor meets every member and compares fingerprints: every member reaches
// the same verdict and raises the same CollectiveMismatch, naming the minority's calls and the
// majority's (disagreement()). It tells the world's observers (observer.hpp) of the call's begin,
// meet and end. A Call left by an exception waits, like finish(), until no member can still read
// this rank's buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>

#include "../world/observer.hpp"
#include "shared_memory.hpp"
#include "transport.hpp"
#include "tspemu/runtime/sim_streams.hpp"

namespace tspemu::detail {

// What the algorithm promises about a call, the same on every member (it follows from the
// fingerprint every member agrees on):
//   general: any steps;
//   step0_only: no member posts after step 0 (CallState::step0_only);
//   rooted_eager: broadcast's eager form (Transport::open_rooted); the root of such a call knows
//     only its own fingerprint, and may return before the members arrive.
enum class CallForm { general, step0_only, rooted_eager };

class Call {
 public:
  Call(Comm& comm, const Fingerprint& fp, std::span<const std::byte> step0,
       bool counts_must_match = true, CallForm form = CallForm::general);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  int rank() const { return st_.rank; }
  int size() const { return st_.size; }
  std::uint64_t seq() const { return st_.seq; }
  // The verbs call the shared-memory transport's own functions directly when the world's transport
  // is one (shm_): the common case pays no virtual dispatch per step.
  const Fingerprint& fingerprint(int member) const {
    return shm_ != nullptr ? shm_->SharedMemoryTransport::fingerprint(st_, member)
                           : t_.fingerprint(st_, member);
  }

  void post(int step, std::span<const std::byte> data) {
    if (shm_ != nullptr) return shm_->SharedMemoryTransport::post(st_, step, data);
    t_.post(st_, step, data);
  }
  void post(int step, Pieces pieces) {
    if (shm_ != nullptr) return shm_->SharedMemoryTransport::post(st_, step, pieces);
    t_.post(st_, step, pieces);
  }
  void recv(int from, int step, std::size_t offset, std::span<std::byte> dst) {
    if (shm_ != nullptr) return shm_->SharedMemoryTransport::recv(st_, from, step, offset, dst);
    t_.recv(st_, from, step, offset, dst);
  }
  void recv_each(int step, std::span<const BlockRead> reads) {
    if (shm_ == nullptr) return t_.recv_each(st_, step, reads);
    for (const BlockRead& r : reads)
      shm_->SharedMemoryTransport::recv(st_, r.from, step, r.offset, {r.dst, r.bytes});
  }
  void recv_rows(int from, int step, std::size_t offset, std::size_t stride, std::size_t row_bytes,
                 std::size_t rows, std::byte* dst, std::size_t dst_stride) {
    if (shm_ != nullptr)
      return shm_->SharedMemoryTransport::recv_rows(st_, from, step, offset, stride, row_bytes,
                                                    rows, dst, dst_stride);
    t_.recv_rows(st_, from, step, offset, stride, row_bytes, rows, dst, dst_stride);
  }
  void recv_reduce(int step, std::size_t offset, std::size_t count, Dtype dtype, std::byte* acc) {
    if (shm_ != nullptr)
      return shm_->SharedMemoryTransport::recv_reduce(st_, step, offset, count, dtype, acc);
    t_.recv_reduce(st_, step, offset, count, dtype, acc);
  }
  // Copies every member's whole step-0 message, member r's to dst + offsets[r] * elem_size, in one
  // pass when the transport has them all at hand (SharedMemoryTransport::recv_all_step0: all in the
  // mailboxes, or their mirrors from other processes, and of the lengths offsets[] gives); returns
  // false, copying nothing, otherwise (the caller then recvs them one by one, which also reports a
  // length that does not match).
  bool recv_all_step0(std::byte* dst, const std::size_t* offsets, std::size_t elem_size);
  void finish();

  // The whole of an eager broadcast (fp: kind broadcast, a valid root, at most kEagerBytes) when
  // nothing observes the call and nothing must run before it (needs_full_call, call.cpp): the
  // transport's open_rooted, the receiver's copy and finish, with its number and flight record,
  // and none of Call's observer and meet machinery (a large share of an 8 B call's instructions
  // in one process: docs/benchmarks.md).
  // Returns false, having done nothing, when the call needs a Call. Same verdicts as Call's:
  // receivers check the root's fingerprint, settling compares everyone's.
  static bool eager_broadcast(Comm& comm, const Fingerprint& fp, std::byte* buf);

 private:
  Transport& t_;
  // The world's transport when it is SharedMemoryTransport itself or a subclass that overrides
  // none of its collective verbs (WorldShared::shared_memory); null otherwise.
  SharedMemoryTransport* shm_;
  CallState st_;
  OpInfo op_;
  bool ended_ = false;  // the observers saw the end
};

// Rank services for the algorithms (implemented over the world's state in call.cpp).
Transport& transport_of(Comm& comm);
void count_traffic(Comm& comm, CollectiveKind kind, std::size_t sent, std::size_t received);
// Records a runtime failure detected by this rank as the run's failure and aborts the world.
void fail_world(Comm& comm, const std::string& message, const std::exception_ptr& error);
template <class E>
[[noreturn]] void raise(Comm& comm, const E& error) {
  fail_world(comm, error.what(), std::make_exception_ptr(error));
  throw error;
}

// Waits until ready() holds (the runtime's one waiting policy: spin, yield, park; polling the
// abort flag and the hang timeout). For waits on several messages at once (wait_any).
void wait_for(Comm& comm, const OpRef& op, const std::function<bool()>& ready);

// The rank's simulated streams (sim_streams.hpp) for a non-blocking collective: its transfer,
// charged by the cost model on the communication stream at issue ({} without a simulated clock),
// and the compute stream's wait for it.
SimStreams::Transfer issue_on_comm_stream(Comm& comm, CollectiveKind kind, std::uint64_t bytes);
void wait_on_comm_stream(Comm& comm, const SimStreams::Transfer& transfer);
// Records a handle destroyed unwaited: the rank raises `message` as std::logic_error at its next
// collective or when its run function returns (the first such message is kept).
void report_unwaited(Comm& comm, const std::string& message);

// The observers (observer.hpp) of this rank's point-to-point operations (send_recv.cpp).
void observe_begin(Comm& comm, OpInfo& op);
void observe_end(Comm& comm, OpInfo& op, bool ok);
bool injecting(const Comm& comm);
std::size_t inject_below(Comm& comm, std::size_t n);  // a draw from the rank's seeded stream

}  // namespace tspemu::detail
