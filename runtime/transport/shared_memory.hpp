// SharedMemoryTransport: the transport of ranks that share one address space (transport.hpp).
//
// Mailbox layout. Each group has one Slot per member, with a ring of kDescriptors descriptors.
// A collective call #s on rank r:
//   1. open: writes its Descriptor into slot[r].desc[s % kDescriptors] (fingerprint, header, step
//      0: where the message is, and for messages of at most kEagerBytes a copy of it), stamps it
//      with call #s (Descriptor::stamp), then stores slot[r].progress = stage_value(s, step 0
//      posted) and waits until every member has: a member's stamp or its progress says so;
//   2. post(step): records where the step's message is, then stores stage_value(s, step posted);
//   3. recv / recv_reduce: wait for the owner's stage, then copy straight from the owner's buffer
//      (single copy) or its eager copy, under the abort-safe reading flag (RankState::reading);
//   4. finish: stores stage_value(s, done); a rank whose own buffers were read in place (not eager)
//      waits for every member to be done before it returns, because its caller may reuse them.
//      Only such an exposing rank waits for the done stage, so a call in which no member can
//      expose one publishes none: a step0_only call (CallState::step0_only: nobody posts later
//      steps) whose members' step 0 messages are all in their mailboxes (eager), which every
//      member sees alike after the meet. Nothing else reads the done stage: a descriptor's reuse
//      needs the members' entries of later calls, and progress only grows.
// Reusing descriptor s % kDescriptors is safe once every member opened #s - kDescriptors + 1: a
// member opens that call only after it finished reading everything of the calls before it. A
// call that meets every member knows this from the meet of #s-1.
//
// Eager broadcast (open_rooted; a payload of at most kEagerBytes). Nobody meets everybody: the
// root copies its payload into its descriptor's `data`, publishes and returns; each receiver
// publishes its own descriptor, waits for the root's alone, checks the root's fingerprint against
// its own and copies the payload from the mailbox. Buffer reuse: the root's caller may reuse its
// buffer at once, because the receivers read the mailbox copy, never the buffer. The mailbox copy
// is not overwritten before every receiver has read it: the root writes that descriptor again only
// at call #s + kDescriptors, and before it does (enter -> settle_unmet) it waits until every member
// opened #s + 1, which a receiver does after it finished reading #s. (The fingerprints compared
// when settling live in a longer ring, Slot::fps.) So a rank runs at most
// kDescriptors - 1 calls ahead of the slowest member in a run of eager broadcasts, and any call
// that meets settles every eager broadcast before it. Settling call #u also compares every
// member's fingerprint of #u (as a meet does), raising CollectiveMismatch: a disagreement that a
// receiver's check against the root cannot see (e.g. two ranks that each call themselves the root)
// fails on every rank at its next meeting call on the group, or at the end of its run (settle).
// A settle that the ring forces also settles every later unmet call all members have entered
// (read from their progress without waiting), so a run of eager broadcasts settles about once per
// kDescriptors calls.
// Nobody exposes a buffer in an eager broadcast, so no done stage is published (Slot::unawaited).
// Point-to-point messages use one Channel per ordered pair with kChannelDepth messages in flight.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "transport.hpp"

namespace tspemu::detail {

inline constexpr std::size_t kEagerBytes = kSmallMessageBytes;
inline constexpr std::uint64_t kChannelDepth = 4;
// Descriptors per slot: how many calls of a run of eager broadcasts a rank may be ahead of the
// slowest member (every other call meets all members, so needs two). Oversubscribed (more ranks
// than cores), a root that reaches the bound yields its core to the members that lag, so the
// depth sets how many broadcasts each context switch pays for (64 against 16: several times fewer
// switches per call, docs/benchmarks.md). Cost: 64 x 448 B of descriptors per member of each
// group.
inline constexpr std::uint64_t kDescriptors = 64;

// Progress values of call #seq: step s posted is s + 1, done is kMaxSteps + 1.
inline constexpr std::uint64_t kStagesPerCall = kMaxSteps + 2;
constexpr std::uint64_t step_stage(int step) {
  return static_cast<std::uint64_t>(step) + 1;
}
inline constexpr std::uint64_t kDoneStage = kMaxSteps + 1;
constexpr std::uint64_t stage_value(std::uint64_t seq, std::uint64_t stage) {
  return seq * kStagesPerCall + stage;
}

// Descriptor::stamp of call #seq: never 0, the value of a descriptor no call has stamped (a slot
// of another process's rank, whose mirror only its progress publishes: mpi.hpp).
constexpr std::uint32_t descriptor_stamp(std::uint64_t seq) {
  return static_cast<std::uint32_t>(seq % 0xFFFFFFFFu) + 1;
}

// Where one step's message is: one span, or an array of pieces owned by the poster.
struct StepMessage {
  const std::byte* single = nullptr;                   // the message, unless it is in pieces
  const std::span<const std::byte>* pieces = nullptr;  // null: the message is `single`
  std::uint64_t piece_count = 0;
  std::uint64_t bytes = 0;
};
static_assert(sizeof(StepMessage) == 32);

// Cache-line layout: a reader of a one-step call (every small collective) needs the fingerprint,
// step 0's location and length, the eager flag and, when eager, the payload. An 8 B payload (the
// common small message: one double, two floats) sits in line 0 with all the rest, so reading a
// member's 8 B call reads one line written by another core, not two. Longer payloads run on into
// the following lines. The header (read only by observers at the meet) and later steps' locations
// (large calls only) follow the payload.
struct alignas(64) Descriptor {
  Fingerprint fp;
  StepMessage step0;
  bool eager = false;  // step 0 copied into `data`
  // descriptor_stamp(#s) once call #s wrote this descriptor and step 0 (release store in enter(),
  // after every field above and step 0's message; pairs with the acquire load in wait_stage). A
  // member of this process waiting for step 0 polls this line, which it reads next anyway, instead
  // of the slot's progress line and then this one.
  // Equal only to #s's own stamp while #s can be waited for: the descriptor holds #s - kDescriptors
  // before, and #s + kDescriptors needs every member to have opened #s + 1 (Group::reset zeroes it
  // between runs, whose calls count from 0 again).
  std::atomic<std::uint32_t> stamp{0};
  alignas(8) std::byte data[kEagerBytes];
  CallHeader header;
  StepMessage later[kMaxSteps - 1];  // steps 1 ..
  StepMessage& step(int s) { return s == 0 ? step0 : later[s - 1]; }
  const StepMessage& step(int s) const { return s == 0 ? step0 : later[s - 1]; }
};
inline constexpr std::size_t kPayloadInLine0 = 8;
static_assert(offsetof(Descriptor, data) + kPayloadInLine0 <= 64,
              "line 0 of a Descriptor holds everything a reader of an 8 B one-step call needs");

struct alignas(64) Slot {
  // Written by the owner only. Its store publishes desc[s % 2] (and each step's message, and
  // completion); pairs with the seq_cst loads in SharedMemoryTransport::wait_stage. The store is
  // also the poster's half of the Parker's Dekker handshake: store_waited (parker.hpp), a release
  // store and a compiler barrier when the waiters' side fences with membarrier, seq_cst otherwise.
  // (MpiTransport's progress thread and finish keep their own seq_cst stores: they are also
  // halves of other store-then-load handshakes, mpi/.)
  std::atomic<std::uint64_t> progress{0};
  // Owner only (and Group::reset between runs): calls #unmet_first .. #unmet_last were eager
  // broadcasts this rank has not yet seen every member enter (open_rooted); 0 when none. On their
  // own line: an eager broadcast writes them right after publishing `progress`, which the members
  // are polling, and would take that line away from them again.
  alignas(64) std::uint64_t unmet_first = 0;
  std::uint64_t unmet_last = 0;
  // Owner only: call #unawaited exposed no member's buffer (an eager broadcast), so nobody waits
  // for its done stage and finish() does not publish it.
  std::uint64_t unawaited = 0;
  // Owner only (and Group::reset): the progress last loaded of member seen_member (-1: none),
  // which wait_stage trusts without loading again (a root running ahead of a run of eager
  // broadcasts is waited for with no access to its progress line).
  int seen_member = -1;
  std::uint64_t seen_progress = 0;
  // Each call's fingerprint again, kept twice as long as its descriptor: settling an eager
  // broadcast #u reads every member's fingerprint of #u while the members may already reuse
  // descriptor u % kDescriptors (they need every member to have opened #u + 1, not settled #u).
  // Entry u is rewritten at call #u + 2·kDescriptors, which needs every member to have opened
  // #u + kDescriptors + 1, and a rank settles #u before it opens #u + kDescriptors - 1.
  alignas(64) Fingerprint fps[2 * kDescriptors];
  alignas(64) Descriptor desc[kDescriptors];
};

struct P2PMessage {
  MessageHeader header;
  const std::byte* data_ptr = nullptr;
  std::uint64_t bytes = 0;
  bool eager = false;
  // kPosted -> kTaken by the receiver (CAS) before it reads a single-copy payload, or
  // kPosted -> kWithdrawn by a sender unwinding past an unfinished isend. The CAS decides who
  // owns the buffer: acq_rel on both sides, so the winner sees the loser's earlier writes.
  // Then, for a single-copy message, -> kConsumed by the receiver once its copy is done (seq_cst
  // store; pairs with the sender's seq_cst load in message_consumed, and is the store half of the
  // Parker handshake): receives from one peer may complete out of order, so this, not the
  // channel's prefix count, says that this message's buffer is free. An eager message stays
  // kPosted: its sender neither waits for it nor withdraws it (send() completes it).
  std::atomic<std::uint32_t> state{0};
  alignas(64) std::byte data[kEagerBytes];
};
enum P2PState : std::uint32_t { kPosted = 1, kTaken = 2, kWithdrawn = 3, kConsumed = 4 };

struct Channel {
  // Sender's count of messages posted; seq_cst store publishes ring[m % depth]; pairs with the
  // receiver's seq_cst load (also the Dekker store of Parker).
  alignas(64) std::atomic<std::uint64_t> posted{0};
  // Receiver's count of the leading messages consumed (every message below it is taken; it
  // never moves backwards, also when receives complete out of order); seq_cst store tells the
  // sender those buffers and slots are free; pairs with the sender's seq_cst loads.
  alignas(64) std::atomic<std::uint64_t> consumed{0};
  // Receiver only: taken[m % depth] == m + 1 once message m is copied out. The receiver advances
  // `consumed` over these rather than over the messages' states, so taking an eager message
  // writes nothing into the sender's message line (whose next write by the sender would then
  // have to fetch it back; the single-copy path still marks kConsumed for the sender's wait).
  std::uint64_t taken[kChannelDepth] = {};
  P2PMessage ring[kChannelDepth];
};

class SharedMemoryTransport : public Transport {
 public:
  SharedMemoryTransport() = default;
  void open(CallState& call, const Fingerprint& fp, const CallHeader& header,
            std::span<const std::byte> step0) override;
  bool open_rooted(CallState& call, const Fingerprint& fp, const CallHeader& header,
                   std::span<const std::byte> step0) override;
  void settle(RankState& self) override;
  const Fingerprint& fingerprint(const CallState& call, int member) const override;
  const CallHeader& header(const CallState& call, int member) const override;
  void post(CallState& call, int step, Pieces pieces) override;
  void post(CallState& call, int step, std::span<const std::byte> data) override;
  void recv(CallState& call, int from, int step, std::size_t offset,
            std::span<std::byte> dst) override;
  void recv_rows(CallState& call, int from, int step, std::size_t offset, std::size_t stride,
                 std::size_t row_bytes, std::size_t rows, std::byte* dst,
                 std::size_t dst_stride) override;
  void recv_reduce(CallState& call, int step, std::size_t offset, std::size_t count, Dtype dtype,
                   std::byte* acc) override;
  void finish(CallState& call) override;
  void abandon(CallState& call) noexcept override;
  // all_gather's small form in one pass, not a verb of every transport (Call::recv_all_step0): when
  // every member's step-0 message is in its mailbox and is exactly (offsets[r + 1] - offsets[r])
  // * elem_size bytes long, copies member r's to dst + offsets[r] * elem_size for every r and
  // returns true; otherwise copies nothing and returns false. No wait: every member met at open
  // (MpiTransport: the mirrors of other processes' members too, with their eager step 0).
  bool recv_all_step0(CallState& call, std::byte* dst, const std::size_t* offsets,
                      std::size_t elem_size);

  bool send(Comm& comm, int dst, std::uint64_t index, const MessageHeader& header,
            std::span<const std::byte> data, const OpRef& op) override;
  void wait_sent(Comm& comm, int dst, std::uint64_t index, const OpRef& op) override;
  bool withdraw_send(Comm& comm, int dst, std::uint64_t index) noexcept override;
  bool arrived(const Comm& comm, int src, std::uint64_t index) const override;
  const MessageHeader& wait_message(Comm& comm, int src, std::uint64_t index,
                                    const OpRef& op) override;
  void take(Comm& comm, int src, std::uint64_t index, std::span<std::byte> dst,
            const OpRef& op) override;

 protected:
  // The dry-run transport (dry.hpp): the same meeting, matching and waiting, without copying the
  // bytes of dry-run memory.
  struct SkipDryMemory {};
  explicit SharedMemoryTransport(SkipDryMemory) : skip_dry_(true) {}

 private:
  // A copy or sum whose source or destination lies in dry-run memory is skipped (one predictable
  // branch per copy; false for every world but a dry one).
  const bool skip_dry_ = false;
  void publish(CallState& call, int step);
  // Writes this rank's descriptor of the call (after meeting the members of an unmet eager
  // broadcast, see above) and publishes step 0.
  void enter(CallState& call, const Fingerprint& fp, const CallHeader& header,
             std::span<const std::byte> step0, bool rooted);
  void wait_all_done_after_abort(CallState& call) noexcept;

 protected:
  // recv_reduce's sum once the step is posted everywhere: acc[0, count) = sum over members in
  // group-rank order of their elements at byte `offset`, member r's read from copied[r] when
  // `copied` and copied[r] are not null (the MPI transport's copy of a member in another process,
  // its element 0 at copied[r]), else from its step message in place (under the reading flag; no
  // wait).
  void sum_members(CallState& call, int step, std::size_t offset, std::size_t count, Dtype dtype,
                   std::byte* acc, const std::byte* const* copied);
  // Waits until `member`'s progress reaches `stage` of this call (the MPI transport's mirrors of
  // members in other processes are waited for the same way: mpi.hpp).
  void wait_stage(CallState& call, int member, std::uint64_t stage);
};

}  // namespace tspemu::detail
