// Non-blocking collectives: ibroadcast, iall_gather, ireduce_scatter, iall_reduce, ireduce. Each
// returns a CollectiveHandle; the operation is complete, and its buffers the caller's again, when
// wait() returns.
//
// What: the blocking collective of the same name (broadcast.hpp, all_gather.hpp, ...), issued now
// and completed later. Layouts, in-place rules, reduction order and cost are the blocking form's.
// Design (progress on wait): issuing records the operation on its Comm; it runs — as the blocking
// algorithm, one collective call marked non-blocking — when this rank waits for it or for a later
// one, or enters any other collective on the Comm (which first runs every pending one, in issue
// order). There is no agent that moves bytes while a rank computes; what overlaps in wall time
// is one rank's copies with another's compute. In a shared-memory world iall_gather (blocks above
// 256 bytes, groups of at most 16) also publishes its buffers at issue
// (runtime/transport/early_exposure.hpp): a member that reaches its own run of the operation while
// this rank is still computing (a kernel, core/compute_span.hpp, begun after the issue) copies
// this rank's block into its own recv and its own block there, then — while this rank still has
// not reached its run — pushes its block into this rank's recv and copies this rank's own block
// there, each block claimed once; this rank's run then skips those blocks. So a rank that waits
// for a slower peer does the peer's copies in the time it would have idled: on 2 cores with both
// ranks busy, the only idle core time there is (bench/overlap_bench.cpp, figures in
// docs/benchmarks.md: skewed ranks gain; balanced ones do not, as a rank arriving just after its
// peer's own copies waits for the push in flight into its buffer).
// Every other operation, and every one in an MPI world, moves no byte before the wait; their
// overlap is the simulated clock's. At issue the operation occupies the rank's
// communication stream for its cost-model time (sim_streams.hpp: SimStreams::issue); wait()
// exposes only what has not finished under the compute charged meanwhile (SimStreams::wait).
// Requirements: every member issues the group's collectives, blocking and non-blocking, in the
// same order; several may be outstanding per Comm and waited in any order. The buffers belong to
// the operation from issue until wait() returns: neither read its outputs nor write its inputs or
// outputs meanwhile. The Comm must neither move nor die while a handle on it is outstanding.
// Guarantees:
//  - results are bitwise those of the blocking form (the same algorithm and reduction order);
//  - fingerprints are checked as for the blocking form, and the non-blocking form never meets the
//    blocking one: iall_gather on one rank against all_gather on another is a CollectiveMismatch
//    naming both ("... rank 0 called iall_gather(count=4, f32) ... rank 1 called all_gather(...)");
//  - a failure elsewhere wakes a waiter with PeerFailure naming the first failure, as for blocking
//    calls; once one of a Comm's operations has failed, waiting for it or any later one rethrows;
//  - a buffer written between issue and wait raises std::logic_error naming the rank, the
//    operation and its sequence number, instead of a silently different result, when the write
//    changed a sampled byte: a digest of the bytes the operation reads or writes, taken at issue
//    and compared when it runs, covers all of a buffer up to 16 KiB and, of a larger one, 256
//    64-byte lines spread evenly over it, its first and last 64 bytes among them. So any change
//    to a buffer's first or last 64 bytes, and any rewrite of a whole buffer with other values,
//    is caught; a write that changes only unsampled bytes of a large buffer goes unnoticed. An
//    exposed iall_gather's receive buffer is checked block by block: a member about to fill a
//    block early compares it with its digest first and leaves a changed one to this rank, so a
//    write made before this rank's first kernel after the issue is still reported; a write made
//    after it races with the members' copies (the buffers are the operation's);
//  - a handle destroyed without wait() (not while unwinding an exception) drops its operation
//    (its buffers may be gone) and the rank fails with std::logic_error naming the operation and
//    its sequence number at its next collective on any group, or when its run function returns;
//    the members waiting for that operation then fail with PeerFailure.
// test() drives the operation like wait() (progress on wait) and returns true; done() asks
// without driving anything.
// Cost: the blocking form's, plus the digest of the operation's buffers at issue and when it runs
// (at most 16 KiB read per buffer, whatever its size; an exposed iall_gather's receive buffer per
// block). The copies are the blocking form's, whoever makes them: traffic counters are the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/dtype.hpp"
#include "tspemu/runtime/sim_streams.hpp"

namespace tspemu {

class CollectiveHandle;

namespace detail {
// The one entry point of the non-blocking forms: kind and root as the blocking call's fingerprint;
// send/recv as the blocking form's arguments (broadcast: recv is the buffer, send unused).
CollectiveHandle issue_collective(Comm& comm, CollectiveKind kind, Dtype dtype, int root,
                                  const std::byte* send, std::size_t send_count, std::byte* recv,
                                  std::size_t recv_count);
}  // namespace detail

class [[nodiscard]] CollectiveHandle {
 public:
  CollectiveHandle() = default;
  CollectiveHandle(CollectiveHandle&& o) noexcept { *this = std::move(o); }
  // A handle still outstanding here is destroyed unwaited first (see above).
  CollectiveHandle& operator=(CollectiveHandle&& o) noexcept;
  CollectiveHandle(const CollectiveHandle&) = delete;
  CollectiveHandle& operator=(const CollectiveHandle&) = delete;
  ~CollectiveHandle();

  // Completes the operation (and every one issued before it on the Comm).
  void wait();
  bool test() {
    wait();
    return true;
  }
  // Whether the operation has completed (waited, or run by a later wait or collective).
  bool done() const;
  // The operation's collective number on its Comm (as in error messages).
  std::uint64_t seq() const { return seq_; }

 private:
  friend CollectiveHandle detail::issue_collective(Comm&, CollectiveKind, Dtype, int,
                                                   const std::byte*, std::size_t, std::byte*,
                                                   std::size_t);
  void abandon() noexcept;
  Comm* comm_ = nullptr;  // null once waited
  std::uint64_t id_ = 0;  // issue number on the Comm (DeferredCalls)
  std::uint64_t seq_ = 0;
  CollectiveKind kind_ = CollectiveKind::barrier;
  SimStreams::Transfer transfer_{};  // on the simulated communication stream
};

template <class T>
CollectiveHandle ibroadcast(Comm& comm, std::span<std::type_identity_t<T>> buf, int root) {
  return detail::issue_collective(comm, CollectiveKind::broadcast, dtype_of<T>(), root, nullptr, 0,
                                  reinterpret_cast<std::byte*>(buf.data()), buf.size());
}

template <class T>
CollectiveHandle iall_gather(Comm& comm, std::span<const std::type_identity_t<T>> send,
                             std::span<std::type_identity_t<T>> recv) {
  return detail::issue_collective(comm, CollectiveKind::all_gather, dtype_of<T>(), -1,
                                  reinterpret_cast<const std::byte*>(send.data()), send.size(),
                                  reinterpret_cast<std::byte*>(recv.data()), recv.size());
}

template <class T>
CollectiveHandle ireduce_scatter(Comm& comm, std::span<const std::type_identity_t<T>> send,
                                 std::span<std::type_identity_t<T>> recv) {
  return detail::issue_collective(comm, CollectiveKind::reduce_scatter, dtype_of<T>(), -1,
                                  reinterpret_cast<const std::byte*>(send.data()), send.size(),
                                  reinterpret_cast<std::byte*>(recv.data()), recv.size());
}

template <class T>
CollectiveHandle iall_reduce(Comm& comm, std::span<const std::type_identity_t<T>> send,
                             std::span<std::type_identity_t<T>> recv) {
  return detail::issue_collective(comm, CollectiveKind::all_reduce, dtype_of<T>(), -1,
                                  reinterpret_cast<const std::byte*>(send.data()), send.size(),
                                  reinterpret_cast<std::byte*>(recv.data()), recv.size());
}

// In place.
template <class T>
CollectiveHandle iall_reduce(Comm& comm, std::span<T> buf) {
  return iall_reduce<T>(comm, std::span<const T>(buf), buf);
}

template <class T>
CollectiveHandle ireduce(Comm& comm, std::span<const std::type_identity_t<T>> send,
                         std::span<std::type_identity_t<T>> recv, int root) {
  return detail::issue_collective(comm, CollectiveKind::reduce, dtype_of<T>(), root,
                                  reinterpret_cast<const std::byte*>(send.data()), send.size(),
                                  reinterpret_cast<std::byte*>(recv.data()), recv.size());
}

}  // namespace tspemu
