// Transport: the keyed point-to-point operations the collective algorithms (runtime/collectives/)
// are written against; the only way an algorithm reaches another rank's data.
//
// What: a message is keyed by (group, collective kind, sequence number, step, sender) and carries
// the sender's Fingerprint. A collective call #seq of a Comm is one CallState: open() posts this
// rank's step 0 and meets every member (fingerprints and headers exchanged), post() makes a later
// step's buffer available to the whole group (the key has no receiver: every member may read it),
// recv() copies a range of one member's step message, recv_reduce() sums a range of every member's
// step message in group-rank order, finish() ends the call. Point-to-point messages are keyed
// (group, send, per-pair message index, 0, sender) and matched in per-pair FIFO order.
// Requirements: steps are posted in increasing order, each at most once, below kMaxSteps; a posted
// buffer (and a multi-piece message's array of pieces) stays valid, and the ranges peers read stay
// unchanged, until finish() returns; every member makes the same calls with the same keys.
// Guarantees: recv/recv_reduce wait until the message is posted (bounded by the world's abort,
// the sender's departure and the hang timeout); finish() returns only once no member can still
// read this rank's posted buffers, and abandon() (an unwinding call) waits the same way for reads
// already started; fingerprints and headers of every member are known after open(). Once the
// world aborts, a read of another rank's buffer throws PeerFailure unless it continues reads
// begun, without a wait between, before the abort (those complete: the owner keeps its buffers
// until they end); a read of a step-0 message that came with the meet (at most
// kSmallMessageBytes) always completes.
// Buffers: recv_reduce's accumulator may alias this rank's own message at the same offset.
// Cost: a transport decides how bytes move (shared_memory.hpp: one copy, straight from the
// sender's buffer; messages of at most kSmallMessageBytes are copied at open).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "op_ref.hpp"
#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/dtype.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::detail {

// Steps per collective call: a call posts steps 0 .. kMaxSteps - 1 (e.g. a description, the
// inputs, the reduced chunks).
inline constexpr int kMaxSteps = 4;
// Step-0 messages up to this size travel with the meet: reading them costs no wait on the sender,
// so algorithms may pick a one-step form below it (all_reduce sums them on every rank).
inline constexpr std::size_t kSmallMessageBytes = 256;

struct Fingerprint {
  Fingerprint() = default;
  constexpr Fingerprint(CollectiveKind k, Dtype d, int r, std::uint64_t c, bool nb = false)
      : kind(k), dtype(d), nonblocking(nb), root(r), count(c) {}
  CollectiveKind kind = CollectiveKind::barrier;
  Dtype dtype = Dtype::byte;
  // The non-blocking form (nonblocking.hpp: iall_gather ...): never meets the blocking one. Sits
  // in padding, so the struct's size and byte image (sent as is by the MPI transport) keep their
  // layout.
  bool nonblocking = false;
  int root = -1;
  std::uint64_t count = 0;
  bool operator==(const Fingerprint&) const = default;
};
static_assert(sizeof(Fingerprint) == 16 && std::is_trivially_copyable_v<Fingerprint>);
std::string describe(const Fingerprint& fp);

// What observers exchange at the meet, beside the fingerprint.
struct CallHeader {
  std::int64_t sim_ns = 0;  // the rank's simulated clock when it entered (sim_clock.hpp)
};

// One message of a step: the concatenation of its pieces.
using Pieces = std::span<const std::span<const std::byte>>;

// One rank's collective call #seq, as the transport sees it. Owned by the caller (Call).
struct CallState {
  Comm* comm = nullptr;
  int rank = 0;
  int size = 0;
  std::uint64_t seq = 0;
  OpRef op;              // for wait diagnoses
  int posted = -1;       // highest step posted
  bool exposed = false;  // a posted buffer may be read in place until finish
  bool finished = false;
  // Set before open by Call, in worlds of the shared-memory transports only (shared_memory.hpp): no
  // member posts a step after step 0 in this call. Every member runs the same algorithm on
  // fingerprints the meet finds compatible, so all of them set it alike.
  bool step0_only = false;
};

// One read of recv_each: `bytes` bytes at `offset` of member `from`'s step message, to dst.
// Trivial (no initializers): the algorithms keep an array of kMaxRanks (8 KiB) on the stack per
// call, 8 B ones included, and fill only the entries they read.
struct BlockRead {
  int from;
  std::size_t offset;
  std::byte* dst;
  std::size_t bytes;
};
static_assert(std::is_trivially_default_constructible_v<BlockRead>);

// The data of a point-to-point message beside its bytes.
struct MessageHeader {
  Fingerprint fp;
  std::uint64_t flow = 0;           // trace flow id of the send, 0 when not tracing
  std::int64_t sim_arrival_ns = 0;  // simulated arrival time at the receiver
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Collectives. `call` has comm, rank, size, seq and op set.
  virtual void open(CallState& call, const Fingerprint& fp, const CallHeader& header,
                    std::span<const std::byte> step0) = 0;
  // Broadcast's eager form: as open(), except that the root, when its step 0 is at most
  // kSmallMessageBytes, returns once step 0 is published, without meeting the members (every
  // other member meets as in open()). Returns whether this rank met every member. When it did not,
  // only its own fingerprint is known; the transport meets the members of that call and compares
  // their fingerprints with this rank's later, before this rank's next call on the group opens or
  // at settle(), raising CollectiveMismatch (disagreement()) on a difference. The default meets.
  virtual bool open_rooted(CallState& call, const Fingerprint& fp, const CallHeader& header,
                           std::span<const std::byte> step0) {
    open(call, fp, header, step0);
    return true;
  }
  // Ends this rank's run: completes the meets open_rooted() deferred, on every group.
  virtual void settle(RankState& /*self*/) {}
  virtual const Fingerprint& fingerprint(const CallState& call, int member) const = 0;
  virtual const CallHeader& header(const CallState& call, int member) const = 0;
  virtual void post(CallState& call, int step, Pieces pieces) = 0;
  virtual void post(CallState& call, int step, std::span<const std::byte> data) = 0;
  // Copies bytes [offset, offset + dst.size()) of member `from`'s step message into dst; an
  // empty dst only waits for the post.
  virtual void recv(CallState& call, int from, int step, std::size_t offset,
                    std::span<std::byte> dst) = 0;
  // recv() of every read, in no particular order: a transport whose reads are requests (mpi.hpp)
  // has them all in flight together rather than one round trip after another. The default reads
  // one after the other.
  virtual void recv_each(CallState& call, int step, std::span<const BlockRead> reads) {
    for (const BlockRead& r : reads) recv(call, r.from, step, r.offset, {r.dst, r.bytes});
  }
  // Copies `rows` rows of row_bytes each: row i from bytes [offset + i·stride, + row_bytes) of
  // member `from`'s step message to dst + i·dst_stride (one wait and one read for all of them).
  virtual void recv_rows(CallState& call, int from, int step, std::size_t offset,
                         std::size_t stride, std::size_t row_bytes, std::size_t rows,
                         std::byte* dst, std::size_t dst_stride) = 0;
  // acc[0, count) = sum over members r in order 0, 1, ... of their step message's elements at
  // byte `offset`.
  virtual void recv_reduce(CallState& call, int step, std::size_t offset, std::size_t count,
                           Dtype dtype, std::byte* acc) = 0;
  virtual void finish(CallState& call) = 0;
  virtual void abandon(CallState& call) noexcept = 0;

  // Point-to-point, message `index` from this rank to `dst` (group ranks). Returns true when the
  // message is already complete (copied at send); else wait_sent / withdraw_send end it.
  virtual bool send(Comm& comm, int dst, std::uint64_t index, const MessageHeader& header,
                    std::span<const std::byte> data, const OpRef& op) = 0;
  virtual void wait_sent(Comm& comm, int dst, std::uint64_t index, const OpRef& op) = 0;
  // Takes the message back if the receiver has not started copying, else waits for its copy.
  // Returns whether the receiver got it.
  virtual bool withdraw_send(Comm& comm, int dst, std::uint64_t index) noexcept = 0;
  virtual bool arrived(const Comm& comm, int src, std::uint64_t index) const = 0;
  // Waits for message `index` from `src` and returns its header; then take() copies it.
  virtual const MessageHeader& wait_message(Comm& comm, int src, std::uint64_t index,
                                            const OpRef& op) = 0;
  // Copies the message into dst (its size checked by the caller against the header) and frees
  // the sender's buffer. Throws PeerFailure if the sender withdrew it (once the world aborts, so
  // the run's failure names the sender's error). The header of wait_message is invalid after.
  virtual void take(Comm& comm, int src, std::uint64_t index, std::span<std::byte> dst,
                    const OpRef& op) = 0;
};

// Whether members calling with fingerprints a and b agree: kind, dtype, form (blocking or not),
// root, and the count when counts_must_match (inline: every call compares every member's with
// member 0's).
inline bool compatible(const Fingerprint& a, const Fingerprint& b, bool counts_must_match) {
  return a.kind == b.kind && a.dtype == b.dtype && a.nonblocking == b.nonblocking &&
         a.root == b.root && (!counts_must_match || a.count == b.count);
}

// The CollectiveMismatch message of call #seq on `group` whose members' fingerprints are
// *fps[0] .. *fps[size - 1] (compatible: equal kind, dtype, form (Fingerprint::nonblocking), root,
// and count when counts_must_match); empty when they are all compatible. Formatted by
// mismatch_message from the classes of compatible calls and describe(); every member formats the
// same message.
std::string disagreement(const std::string& group, std::uint64_t seq, int size,
                         const Fingerprint* const* fps, bool counts_must_match);

// The CollectiveMismatch message of call #seq on `group` whose member r made call calls[r], of
// class cls[r] of compatible calls (classes numbered from 0). A unique largest class is the calls
// the others made, and the headline names the rest as deviating ("collective #3 on group world:
// rank 0 called X while ranks 1-3 called Y"); without one it says the ranks split ("ranks split
// 2/2: ranks 0-1 called X, ranks 2-3 called Y"). Members of a class with equal calls[] are listed
// together. A function of its arguments only, so members with the same inputs agree.
std::string mismatch_message(const std::string& group, std::uint64_t seq, std::span<const int> cls,
                             std::span<const std::string> calls);

// acc[0, count) = sum over r in [0, n) of srcs[r][0, count), rank order; safe when acc aliases a
// source (tiled: a tile is read from every source before it is written).
void sum_ranks_into(Dtype dtype, std::byte* acc, const std::byte* const* srcs, int n,
                    std::size_t count);

}  // namespace tspemu::detail
