#include "early_exposure.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <thread>

#include "../world/dry_reservation.hpp"
#include "../world/world_state.hpp"
#include "deferred_calls.hpp"

namespace tspemu::detail {

namespace {

using Op = ExposedOperation;

// How much of a peer's block a pull copies per entry into its gate (a close() waits this long at
// most for a pull: ~10 us at memcpy speed).
constexpr std::size_t kPullChunkBytes = std::size_t{256} << 10;

std::span<const std::byte> block_of(const std::byte* buf, std::size_t bytes, int b) {
  return {buf + static_cast<std::size_t>(b) * bytes, bytes};
}

// Enters the gate of `e` if it holds operation #seq and is open.
bool enter(Op& e, std::uint64_t seq) {
  std::uint64_t g = e.gate.load(std::memory_order_relaxed);
  for (;;) {
    if ((g >> Op::kGateSeqShift) != seq || (g & Op::kGateClosed) != 0) return false;
    // acquire: pairs with the owner's release store opening #seq (its fields and digests).
    if (e.gate.compare_exchange_weak(g, g + 1, std::memory_order_acquire,
                                     std::memory_order_relaxed))
      return true;
  }
}

void leave(Op& e) {
  // release: this member's copies happen before the owner's close() sees it gone.
  e.gate.fetch_sub(1, std::memory_order_release);
}

// Waits, with the closed bit set, until no member is inside `e`: each is in one bounded memcpy
// (or a digest), never in a wait, so this ends. Returns the gate.
std::uint64_t wait_empty(Op& e) {
  // acquire: pairs with each member's release decrement in leave().
  std::uint64_t g = e.gate.load(std::memory_order_acquire);
  while ((g & Op::kGateInside) != 0) {
    std::this_thread::yield();
    g = e.gate.load(std::memory_order_acquire);
  }
  return g;
}

// Copies src into block b of the owner's recv in `e` once this member's claim of the block wins
// and the block is as it was at issue; a changed block is left to the owner (its close() reports
// it). Inside the gate.
void fill_block(Op& e, int b, const std::byte* src) {
  auto& state = e.block[static_cast<std::size_t>(b)];
  std::uint32_t open = Op::kOpen;
  if (!state.compare_exchange_strong(open, Op::kClaimed, std::memory_order_relaxed)) return;
  std::byte* dst = e.recv + static_cast<std::size_t>(b) * e.block_bytes;
  if (digest_of({dst, e.block_bytes}) != e.block_digest[static_cast<std::size_t>(b)]) {
    state.store(Op::kOpen, std::memory_order_relaxed);
    return;
  }
  std::memcpy(dst, src, e.block_bytes);
  state.store(Op::kFilled, std::memory_order_relaxed);
}

}  // namespace

void MemberExposures::reset() {
  for (Op& e : ring) {
    e.gate.store(Op::kGateClosed, std::memory_order_relaxed);
    for (auto& b : e.block) b.store(Op::kOpen, std::memory_order_relaxed);
  }
}

bool exposable(Comm& comm, const std::byte* send, std::byte* recv, std::size_t block_bytes) {
  return comm.self().world->shared_memory != nullptr && comm.size() <= kMaxExposedBlocks &&
         block_bytes > kSmallMessageBytes && !DryReservation::holds(send) &&
         !DryReservation::holds(recv);
}

EarlyExposure::EarlyExposure(Comm& comm, std::uint64_t seq, const Fingerprint& fp,
                             const std::byte* send, std::byte* recv, std::size_t block_bytes)
    : comm_(comm),
      size_(comm.size()),
      seq_(seq),
      fp_(fp),
      send_(send),
      recv_(recv),
      block_bytes_(block_bytes) {
  const int n = comm.size();
  for (int b = 0; b < n; ++b) block_digest_[b] = digest_of(block_of(recv, block_bytes, b));
  Op& e = comm.group().exposures[static_cast<std::size_t>(comm.rank())].ring[seq % kExposureRing];
  // relaxed: only this thread opens or closes its entries; wait_empty acquires the members' exits.
  if ((e.gate.load(std::memory_order_relaxed) & Op::kGateClosed) == 0) return;  // held: older op
  wait_empty(e);
  e.fp = fp;
  e.send = send;
  e.recv = recv;
  e.block_bytes = block_bytes;
  // relaxed: this thread's own counter.
  e.compute_epoch = comm.self().computes_begun.load(std::memory_order_relaxed);
  for (int b = 0; b < n; ++b) {
    e.block_digest[b] = block_digest_[b];
    e.block[static_cast<std::size_t>(b)].store(Op::kOpen, std::memory_order_relaxed);
  }
  // release: publishes the fields above; pairs with the members' acquire CAS in enter().
  e.gate.store(seq << Op::kGateSeqShift, std::memory_order_release);
  entry_ = &e;
}

void EarlyExposure::close() noexcept {
  if (entry_ == nullptr) return;
  Op& e = *entry_;
  entry_ = nullptr;
  // relaxed RMW: refuses later entries (enter() sees the bit); the acquire in wait_empty orders
  // the copies of the members still inside before everything after.
  e.gate.fetch_or(Op::kGateClosed, std::memory_order_relaxed);
  wait_empty(e);
  for (int b = 0; b < size_; ++b)
    if (e.block[static_cast<std::size_t>(b)].load(std::memory_order_relaxed) == Op::kFilled)
      filled_by_peers_ |= std::uint32_t{1} << b;
}

bool EarlyExposure::blocks_unchanged() const {
  for (int b = 0; b < size_; ++b)
    if ((filled_by_peers_ >> b & 1) == 0 &&
        digest_of(block_of(recv_, block_bytes_, b)) != block_digest_[b])
      return false;
  return true;
}

std::uint32_t EarlyExposure::fill_from_peers() {
  std::uint32_t present = filled_by_peers_;
  const Group& g = comm_.group();
  const int n = comm_.size(), me = comm_.rank();
  // This member's own work first (the pulls and its own block: work it does at the meet anyway,
  // so doing it now costs nothing), then the computing members' (push, and their own blocks), each
  // only while that member's gate is open, i.e. while it has not reached its own call. So when
  // the members arrive together each copies its own blocks in parallel as in the blocking form,
  // and a member that computes longer than this one's own copies finds its blocks filled.
  std::uint32_t ready_mask = 0;     // members still computing, fingerprint equal
  std::uint32_t in_place_mask = 0;  // ... whose send is their own block of recv
  const std::byte* peer_send[kMaxExposedBlocks] = {};
  for (int i = 1; i < n; ++i) {
    const int p = (me + i) % n;
    Op& e = g.exposures[static_cast<std::size_t>(p)].ring[seq_ % kExposureRing];
    const RankState& peer =
        *g.world->ranks[static_cast<std::size_t>(g.world_ranks[static_cast<std::size_t>(p)])];
    if (!enter(e, seq_)) continue;  // not issued yet, already running, or its entry was busy
    // acquire: pairs with the release store of the peer's compute counter at a kernel's begin;
    // its writes before that kernel happen before our reads of its buffers.
    const bool ready =
        e.fp == fp_ && peer.computes_begun.load(std::memory_order_acquire) > e.compute_epoch;
    if (ready) {
      // The fields stay those of #seq for as long as the entry holds #seq (enter() checks it).
      peer_send[p] = e.send;
      ready_mask |= std::uint32_t{1} << p;
      if (e.send == e.recv + static_cast<std::size_t>(p) * block_bytes_)
        in_place_mask |= std::uint32_t{1} << p;
    }
    leave(e);
    if (!ready || (present >> p & 1) != 0) continue;
    // Pull, a chunk per entry into the gate: a member reaching its own call (close()) waits for
    // one chunk, not a whole block. A pull cut short is redone at the meet.
    bool whole = true;
    for (std::size_t off = 0; off < block_bytes_ && whole; off += kPullChunkBytes) {
      if (!enter(e, seq_)) {
        whole = false;
        break;
      }
      std::memcpy(recv_ + static_cast<std::size_t>(p) * block_bytes_ + off, peer_send[p] + off,
                  std::min(kPullChunkBytes, block_bytes_ - off));
      leave(e);
    }
    if (whole) present |= std::uint32_t{1} << p;
  }
  if (ready_mask == 0) return present;
  std::byte* own = recv_ + static_cast<std::size_t>(me) * block_bytes_;
  if ((present >> me & 1) == 0 && send_ != own) {
    std::memcpy(own, send_, block_bytes_);
    present |= std::uint32_t{1} << me;
  }
  for (int i = 1; i < n; ++i) {
    const int p = (me + i) % n;
    if ((ready_mask >> p & 1) == 0) continue;
    Op& e = g.exposures[static_cast<std::size_t>(p)].ring[seq_ % kExposureRing];
    // One block per entry into the gate: the owner's close() waits for one memcpy at most.
    if (enter(e, seq_)) {  // push
      fill_block(e, me, send_);
      leave(e);
    }
    // The entry may hold a later operation by now: enter() refuses it, so peer_send[p] is only
    // used while the entry still holds #seq.
    if ((in_place_mask >> p & 1) == 0 && enter(e, seq_)) {  // the member's own block
      fill_block(e, p, peer_send[p]);
      leave(e);
    }
  }
  return present;
}

}  // namespace tspemu::detail
