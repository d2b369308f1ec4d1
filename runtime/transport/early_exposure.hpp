// EarlyExposure: a non-blocking all_gather's buffers, published at issue in shared-memory worlds,
// so a member that reaches its wait first copies blocks of the call while the issuer computes.
//
// What: at issue (nonblocking.hpp: iall_gather), the issuer publishes for its operation #seq on
// the group its fingerprint, its send and receive buffers and a digest of each receive block, in
// the ExposedOperation of its member slot for that sequence number. A member that runs the same
// operation #seq (equal fingerprint) while the issuer has not started its own run — the time it
// would otherwise spend waiting for the issuer at the meet — fills blocks (fill_from_peers):
//   push:  its own send → the issuer's recv block of this member;
//   pull:  the issuer's send → its own recv block of the issuer;
//   local: the issuer's send → the issuer's own recv block (not in place; one member claims it).
// When its own run starts, the issuer closes the exposure (close()): no member may start a copy
// after that, and the issuer's call skips the blocks members filled; the blocking algorithm moves
// the rest as usual. The bytes are the same whoever copies them, so results and traffic counters
// are the blocking form's.
//
// Invariants.
//  - Who writes which bytes of an issuer's recv, and when: block b (b != issuer) only by member b
//    (push), block `issuer` only by the one member whose claim succeeds (local), each only between
//    the issue and close(), and only inside the gate (below); after close() only the issuer's
//    own call writes its recv.
//  - Who reads the issuer's send: members pulling or copying the local block, inside the gate,
//    before close() returns.
//  - The gate (ExposedOperation::gate) counts the members inside, each for one block copy (push,
//    local) or one 256 KiB chunk of a pull, and close() sets its closed bit, then waits until
//    nobody is inside (a bounded wait: one memcpy per member, never a wait on anything else).
//  - Order: a member first pulls (chunk by chunk) and copies its own block — work its own call
//    does anyway — and only then pushes and copies the issuer's own block, each only if the
//    issuer has not closed meanwhile. So members that arrive together each copy their own blocks
//    in parallel, as in the blocking form, and an issuer that computes longer than the member's
//    own copies finds its blocks filled. So close() returns only after every copy that
//    touches the issuer's buffers has ended, and refuses all later ones; the issuer's buffers are
//    therefore untouched by peers after its call starts running, and a fortiori after wait()
//    returns (the call's own reads of them end, as before, at the transport's done stage).
//  - Failure: close() runs on every way out of an exposed operation — before it runs, when its
//    handle is destroyed unwaited (also while unwinding an exception thrown in the compute) and
//    when an earlier operation's failure discards it (DeferredCalls) — so a rank that throws
//    while a peer pushes into its buffers waits, bounded, for that copy, and no peer writes
//    after it unwinds.
//  - Fingerprints: a member copies nothing unless the issuer's exposed fingerprint equals its own
//    (kind, dtype, non-blocking form, count); a mismatch is reported by the normal path (the
//    meet) exactly as without exposure, and nothing is written into the mismatched member.
//  - Misuse: a member starts copying only after the issuer began a compute kernel after the issue
//    (core/compute_span.hpp: the thread's compute counter, raised with release at every span's
//    begin). Writes the issuer made to its buffers before that kernel are ordered before the
//    member's copies: a member pushing into a block first compares the block with its digest at
//    issue and leaves a changed block to the issuer, whose close() reports it; a changed send is
//    reported by the issuer's own digest check. A write after the issuer began computing races
//    with the members' copies (it breaks the contract: the buffers belong to the operation).
// Requirements: one rank's exposures are opened and closed on its own thread; the group has at
// most kMaxExposedBlocks members; the arguments were checked (recv holds size() blocks of
// block_bytes; send is this rank's block of recv or does not overlap it); not dry-run memory.
// Cost: at issue, a digest of each receive block (256 sampled lines each above 16 KiB); per
// block copied early, one CAS on the gate and a digest of the destination block; close(): one
// RMW, and a digest of the blocks the issuer still owns.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport.hpp"
#include "tspemu/runtime/comm.hpp"

namespace tspemu::detail {

// Groups of at most this many members expose their all_gathers; larger ones run as before.
inline constexpr int kMaxExposedBlocks = 16;
// Exposed operations per member at a time (entry seq % kExposureRing); an operation whose entry is
// still held by an older pending one is not exposed.
inline constexpr std::uint64_t kExposureRing = 4;

// One member's exposed operation. The fields after `gate` are written by the owner only while the
// gate is closed with nobody inside, and read by members only inside the gate.
struct ExposedOperation {
  // (seq << kGateSeqShift) | closed bit | members inside. The owner's release store (opening #seq)
  // publishes the fields; pairs with a member's acquire CAS on entering. A member's release
  // decrement on leaving publishes its copies; pairs with the owner's acquire loads in close().
  std::atomic<std::uint64_t> gate{kGateClosed};
  Fingerprint fp;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::size_t block_bytes = 0;
  std::uint64_t compute_epoch = 0;  // the owner's compute counter at issue
  std::uint64_t block_digest[kMaxExposedBlocks] = {};
  // kOpen -> kClaimed (a member's CAS) -> kFilled, or back to kOpen when the block changed since
  // issue. Relaxed: they decide between members only (the loser copies nothing); the owner reads
  // them after close(), ordered by the gate.
  std::atomic<std::uint32_t> block[kMaxExposedBlocks] = {};

  static constexpr std::uint64_t kGateClosed = std::uint64_t{1} << 15;
  static constexpr std::uint64_t kGateInside = kGateClosed - 1;
  static constexpr int kGateSeqShift = 16;
  static constexpr std::uint32_t kOpen = 0, kClaimed = 1, kFilled = 2;
};

// A member's exposed operations, in its group's mailbox (Group::exposures).
struct alignas(64) MemberExposures {
  ExposedOperation ring[kExposureRing];
  void reset();  // only while no rank runs
};

// The issuer's side of one exposed all_gather (owned by its DeferredCall;
// nonblocking/nonblocking.cpp).
class EarlyExposure {
 public:
  // Computes the receive blocks' digests and publishes the operation if its entry is free (the
  // digests are kept either way: close() checks them).
  EarlyExposure(Comm& comm, std::uint64_t seq, const Fingerprint& fp, const std::byte* send,
                std::byte* recv, std::size_t block_bytes);
  EarlyExposure(const EarlyExposure&) = delete;
  EarlyExposure& operator=(const EarlyExposure&) = delete;
  ~EarlyExposure() { close(); }

  // Ends the members' access (see above; idempotent, noexcept: it only waits for copies in
  // flight).
  void close() noexcept;
  // After close(), while the buffers are alive: whether every receive block the members did not
  // fill is unchanged since issue (the digest check of the receive buffer, DeferredCalls).
  bool blocks_unchanged() const;
  // In this rank's run, after close(): fills blocks of the members' exposed operations #seq (push,
  // pull, local, above) and returns the mask of this rank's receive blocks already in place (filled
  // by members before close(), or pulled now), for all_gather to skip.
  std::uint32_t fill_from_peers();

 private:
  Comm& comm_;  // used in the run only: close() may run while the Comm is being destroyed
  int size_;
  std::uint64_t seq_;
  Fingerprint fp_;
  const std::byte* send_;
  std::byte* recv_;
  std::size_t block_bytes_;
  ExposedOperation* entry_ = nullptr;  // null: not published, or closed
  std::uint32_t filled_by_peers_ = 0;  // this rank's receive blocks the members filled
  std::uint64_t block_digest_[kMaxExposedBlocks] = {};
};

// Whether an all_gather with these (checked) arguments may be exposed: a shared-memory world, a
// group of at most kMaxExposedBlocks members, blocks above kSmallMessageBytes (smaller ones travel
// in the mailbox at the meet), no dry-run memory.
bool exposable(Comm& comm, const std::byte* send, std::byte* recv, std::size_t block_bytes);

}  // namespace tspemu::detail
