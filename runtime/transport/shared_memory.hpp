// SharedMemoryTransport: the transport of ranks that share one address space (transport.hpp).
//
// Mailbox layout. Each group has one Slot per member. A collective call #s on rank r:
//   1. open: writes its Descriptor into slot[r].desc[s % 2] (fingerprint, header, step 0: where
//      the message is, and for messages of at most kEagerBytes a copy of it), then stores
//      slot[r].progress = stage_value(s, step 0 posted) and waits until every member has;
//   2. post(step): records where the step's message is, then stores stage_value(s, step posted);
//   3. recv / recv_reduce: wait for the owner's stage, then copy straight from the owner's buffer
//      (single copy) or its eager copy, under the abort-safe reading flag (RankState::reading);
//   4. finish: stores stage_value(s, done); a rank whose own buffers were read in place (not eager)
//      waits for every member to be done before it returns, because its caller may reuse them.
// Double buffering by s % 2 is safe: rank r writes desc[s % 2] only after seeing every member
// open #s-1, and a member opens #s-1 only after it finished reading everything of #s-2.
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

// Progress values of call #seq: step s posted is s + 1, done is kMaxSteps + 1.
inline constexpr std::uint64_t kStagesPerCall = kMaxSteps + 2;
constexpr std::uint64_t step_stage(int step) {
  return static_cast<std::uint64_t>(step) + 1;
}
inline constexpr std::uint64_t kDoneStage = kMaxSteps + 1;
constexpr std::uint64_t stage_value(std::uint64_t seq, std::uint64_t stage) {
  return seq * kStagesPerCall + stage;
}

// Where one step's message is: one span, or an array of pieces owned by the poster.
struct StepMessage {
  std::span<const std::byte> single;
  const std::span<const std::byte>* pieces = nullptr;  // null: the message is `single`
  std::size_t piece_count = 0;
  std::uint64_t bytes = 0;
};

struct Descriptor {
  Fingerprint fp;
  CallHeader header;
  StepMessage steps[kMaxSteps];
  bool eager = false;  // step 0 copied into `data`
  alignas(64) std::byte data[kEagerBytes];
};

struct alignas(64) Slot {
  // Written by the owner only. seq_cst store publishes desc[s % 2] (and each step's message,
  // and completion); pairs with the seq_cst loads in SharedMemoryTransport::wait_stage. seq_cst
  // rather than release because the same store is half of the Parker's Dekker handshake.
  std::atomic<std::uint64_t> progress{0};
  alignas(64) Descriptor desc[2];
};

struct P2PMessage {
  MessageHeader header;
  const std::byte* data_ptr = nullptr;
  std::uint64_t bytes = 0;
  bool eager = false;
  // kPosted -> kTaken by the receiver (CAS) before it reads a single-copy payload, or
  // kPosted -> kWithdrawn by a sender unwinding past an unfinished isend. The CAS decides who
  // owns the buffer: acq_rel on both sides, so the winner sees the loser's earlier writes.
  // Then -> kConsumed by the receiver once its copy is done (seq_cst store; pairs with the
  // sender's seq_cst load in message_consumed, and is the store half of the Parker handshake):
  // receives from one peer may complete out of order, so this, not the channel's prefix count,
  // says that this message's buffer is free.
  std::atomic<std::uint32_t> state{0};
  alignas(64) std::byte data[kEagerBytes];
};
enum P2PState : std::uint32_t { kPosted = 1, kTaken = 2, kWithdrawn = 3, kConsumed = 4 };

struct Channel {
  // Sender's count of messages posted; seq_cst store publishes ring[m % depth]; pairs with the
  // receiver's seq_cst load (also the Dekker store of Parker).
  alignas(64) std::atomic<std::uint64_t> posted{0};
  // Receiver's count of the leading messages consumed (every message below it is kConsumed; it
  // never moves backwards, also when receives complete out of order); seq_cst store tells the
  // sender those buffers and slots are free; pairs with the sender's seq_cst loads.
  alignas(64) std::atomic<std::uint64_t> consumed{0};
  P2PMessage ring[kChannelDepth];
};

class SharedMemoryTransport : public Transport {
 public:
  SharedMemoryTransport() = default;
  void open(CallState& call, const Fingerprint& fp, const CallHeader& header,
            std::span<const std::byte> step0) override;
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
  void wait_stage(CallState& call, int member, std::uint64_t stage);
  void wait_all_done_after_abort(CallState& call) noexcept;
};

}  // namespace tspemu::detail
