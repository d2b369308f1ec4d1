#include "shared_memory.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../world/dry_reservation.hpp"
#include "../world/wait.hpp"
#include "../world/world_state.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

namespace {

Slot& slot(const CallState& c, int member) {
  return c.comm->group().slots[static_cast<std::size_t>(member)];
}
Descriptor& desc(const CallState& c, int member) {
  return slot(c, member).desc[c.seq % kDescriptors];
}

// A mailbox copy (at most kEagerBytes). 8 to 16 bytes — an 8 B collective's payload, the common
// small message — as two overlapping 8-byte moves inline rather than a call into libc's memcpy,
// which costs more than the rest of such a copy's path.
void copy_small(std::byte* dst, const std::byte* src, std::size_t n) {
  if (n >= 8 && n <= 16) {
    std::uint64_t head = 0;
    std::uint64_t tail = 0;
    std::memcpy(&head, src, 8);
    std::memcpy(&tail, src + n - 8, 8);
    std::memcpy(dst, &head, 8);
    std::memcpy(dst + n - 8, &tail, 8);
    return;
  }
  std::memcpy(dst, src, n);
}

void unpark_members(const Group& g, int me) {
  // Locals: the seq_cst loads in unpark() keep the compiler from caching these across the loop.
  const int n = g.size();
  Parker* const* parkers = g.parkers.data();
  for (int r = 0; r < n; ++r)
    if (r != me) parkers[r]->unpark();
}

// World rank of a group member the caller already validated (Comm::world_rank checks the range
// and costs a call on every message).
int world_rank_of(const Comm& c, int group_rank) {
  return c.group().world_ranks[static_cast<std::size_t>(group_rank)];
}

RankState& state_of(const Comm& c, int group_rank) {
  return *c.group().world->ranks[static_cast<std::size_t>(world_rank_of(c, group_rank))];
}

// The abort-safe reading flag (RankState::reading) is held over a run of reads of other ranks'
// buffers: raised by the first such read, lowered only before this rank blocks (wait_stage) and
// at finish/abandon. A call thus pays one handshake per run of reads (e.g. all of all_gather's
// blocks), not one per read. The handshake still holds: the flag is raised, then `aborted`
// rechecked, exactly as for one read; an exposing rank that aborts waits while the flag is up
// (wait_all_done_after_abort), and the flag only stays up over bounded work (copies and sums,
// never a wait), so that wait is bounded. Reads made in a run begun before the abort complete
// from buffers their owner keeps until the flag drops; a read that begins a run after it throws.
void begin_reading(RankState& self, const OpRef& op) {
  // relaxed: only this thread writes its own flag.
  if (self.reading.load(std::memory_order_relaxed)) return;
  // seq_cst store then seq_cst load: the reader half of the handshake in RankState::reading.
  self.reading.store(true, std::memory_order_seq_cst);
  if (self.world->aborted.load(std::memory_order_seq_cst)) {
    self.reading.store(false, std::memory_order_release);
    check_abort(self, op);
  }
}
void end_reading(RankState& self) {
  // relaxed load: only this thread writes its own flag. release store: our reads of peers'
  // buffers happen before a peer that sees `false` frees them.
  if (self.reading.load(std::memory_order_relaxed))
    self.reading.store(false, std::memory_order_release);
}

[[noreturn]] void out_of_range(const CallState& c, int member, int step, std::size_t offset,
                               std::size_t len, std::uint64_t bytes) {
  throw std::logic_error("rank " + std::to_string(c.comm->world_rank(c.rank)) + ": " + c.op.what +
                         " #" + std::to_string(c.seq) + " reads bytes [" + std::to_string(offset) +
                         ", " + std::to_string(offset + len) + ") of member " +
                         std::to_string(member) + "'s step " + std::to_string(step) +
                         " message of " + std::to_string(bytes) + " bytes");
}

// Where byte `pos` of a message is and how many bytes follow it contiguously (0: past the end).
std::pair<const std::byte*, std::size_t> locate(const StepMessage& m, std::size_t pos) {
  if (m.pieces == nullptr)
    return pos < m.bytes ? std::pair{m.single + pos, m.bytes - pos}
                         : std::pair{nullptr, std::size_t{0}};
  for (std::size_t i = 0; i < m.piece_count; ++i) {
    const std::size_t size = m.pieces[i].size();
    if (pos < size) return {m.pieces[i].data() + pos, size - pos};
    pos -= size;
  }
  return {nullptr, 0};
}

// Whether a copy between dst and src would touch dry-run memory (never backed: dry.hpp).
bool touches_dry(const void* dst, const void* src) {
  return DryReservation::holds(dst) || DryReservation::holds(src);
}

void copy_range(const CallState& c, int member, int step, const StepMessage& m, std::size_t offset,
                std::span<std::byte> dst, bool skip_dry) {
  if (offset + dst.size() > m.bytes) out_of_range(c, member, step, offset, dst.size(), m.bytes);
  if (m.pieces == nullptr) {  // one span: every message but a set of buffers
    const std::byte* src = m.single + offset;
    if (src != dst.data() && !dst.empty() && !(skip_dry && touches_dry(dst.data(), src)))
      std::memcpy(dst.data(), src, dst.size());
    return;
  }
  std::size_t done = 0;
  while (done < dst.size()) {
    const auto [src, avail] = locate(m, offset + done);
    const std::size_t len = std::min(avail, dst.size() - done);
    if (src != dst.data() + done && !(skip_dry && touches_dry(dst.data(), src)))
      std::memcpy(dst.data() + done, src, len);
    done += len;
  }
}

// Whether the step's message is the eager copy in the owner's slot, which outlives the call:
// reading it needs no reading flag (and so does not fail once the world aborts).
bool in_mailbox(const Descriptor& d, int step) {
  return step == 0 && d.eager;
}

// Whether some member of the call may expose a buffer, so wait for this rank's done stage
// (shared_memory.hpp: the done stage). In a step0_only call only a step 0 outside the mailbox
// does; every member's descriptor of the call is stable from the meet on.
bool any_member_exposes(const CallState& c) {
  if (!c.step0_only) return true;
  for (int r = 0; r < c.size; ++r)
    if (!desc(c, r).eager) return true;
  return false;
}

void check_step(const CallState& c, int step) {
  if (c.step0_only)
    throw std::logic_error(std::string(c.op.what) + " #" + std::to_string(c.seq) + " posts step " +
                           std::to_string(step) + " in a call whose members post step 0 only");
  if (step <= c.posted || step >= kMaxSteps)
    throw std::logic_error(std::string(c.op.what) + " #" + std::to_string(c.seq) + " posts step " +
                           std::to_string(step) + " after step " + std::to_string(c.posted) +
                           " (steps go up, below " + std::to_string(kMaxSteps) + ")");
}

// Whether message `index` of the channel has been copied by its receiver. Only for the sender of
// an unfinished message: its slot is not reused before consumed passes index, so the slot's state
// is this message's.
bool message_consumed(const Channel& ch, std::uint64_t index) {
  // seq_cst: pairs with the receiver's seq_cst stores of `consumed` and of the message's state.
  return ch.consumed.load(std::memory_order_seq_cst) >= index + 1 ||
         ch.ring[index % kChannelDepth].state.load(std::memory_order_seq_cst) == kConsumed;
}

// Meets the members of this rank's unmet eager broadcasts up to call #upto (member `me` of g)
// and compares every member's fingerprint of each (shared_memory.hpp: Eager broadcast). The
// members' fingerprints of those calls are stable here (Slot::fps).
void settle_unmet(RankState& self, Group& g, int me, std::uint64_t upto) {
  Slot& own = g.slots[static_cast<std::size_t>(me)];
  const std::uint64_t first = own.unmet_first;
  std::uint64_t last = std::min(own.unmet_last, upto);
  if (first == 0 || last < first) return;
  const int n = g.size();
  // Settle also every later unmet call that all members have entered already: a run of eager
  // broadcasts then settles once per ~kDescriptors calls, not once per call. Their fingerprints
  // are as stable as #upto's (entry u is rewritten only after this rank opens
  // #u + kDescriptors + 1, and u < this rank's current call).
  std::uint64_t all_entered = own.unmet_last;
  for (int i = 1; i < n && all_entered > last; ++i) {
    // seq_cst: as in the wait below (pairs with member r's seq_cst store in publish).
    const std::uint64_t p =
        g.slots[static_cast<std::size_t>((me + i) % n)].progress.load(std::memory_order_seq_cst);
    all_entered =
        std::min(all_entered, p < step_stage(0) ? 0 : (p - step_stage(0)) / kStagesPerCall);
  }
  last = std::max(last, all_entered);
  // Moved on first: if a wait below throws, the run is failing and nothing is left to settle.
  if (last == own.unmet_last) {
    own.unmet_first = own.unmet_last = 0;
    --self.unmet_calls;
  } else {
    own.unmet_first = last + 1;
  }
  const Fingerprint& newest = own.fps[last % (2 * kDescriptors)];
  const OpRef op{collective_name(newest.kind),           last, &g, -1, "every member to enter",
                 newest.count * dtype_size(newest.dtype)};
  // Progress is monotonic: a member that entered #last entered every earlier call.
  const std::uint64_t entered = stage_value(last, step_stage(0));
  for (int i = 1; i < n; ++i) {
    const int r = (me + i) % n;
    const auto& progress = g.slots[static_cast<std::size_t>(r)].progress;
    // seq_cst: acquires member r's descriptors up to #last (pairs with its seq_cst store in
    // publish) and is the load half of the Parker handshake.
    wait_until(self, g.world_ranks[static_cast<std::size_t>(r)], op,
               [&] { return progress.load(std::memory_order_seq_cst) >= entered; });
  }
  for (std::uint64_t u = first; u <= last; ++u) {
    const Fingerprint* fps[kMaxRanks];
    bool agree = true;
    for (int r = 0; r < n; ++r) {
      fps[r] = &g.slots[static_cast<std::size_t>(r)].fps[u % (2 * kDescriptors)];
      agree = agree && compatible(*fps[0], *fps[r], /*counts_must_match=*/true);
    }
    if (!agree)
      raise(self, CollectiveMismatch(disagreement(g.name, u, n, fps, /*counts_must_match=*/true)));
  }
}

}  // namespace

void SharedMemoryTransport::publish(CallState& c, int step) {
  // The poster's half of the Parker handshake (store_waited, parker.hpp), release at least:
  // publishes the descriptor and step message to the members' acquire (seq_cst) loads.
  store_waited(slot(c, c.rank).progress, stage_value(c.seq, step_stage(step)));
  unpark_members(c.comm->group(), c.rank);
}

void SharedMemoryTransport::enter(CallState& c, const Fingerprint& fp, const CallHeader& header,
                                  std::span<const std::byte> step0, bool rooted) {
  // Descriptor c.seq % kDescriptors is free once every member entered #seq - kDescriptors + 1: a
  // call that meets settles every unmet call before it, an eager broadcast only what that needs.
  Slot& own = slot(c, c.rank);
  const std::uint64_t upto = !rooted                ? c.seq - 1
                             : c.seq < kDescriptors ? 0
                                                    : c.seq + 1 - kDescriptors;
  if (own.unmet_first != 0 && own.unmet_first <= upto)
    settle_unmet(c.comm->self(), c.comm->group(), c.rank, upto);
  own.fps[c.seq % (2 * kDescriptors)] = fp;
  Descriptor& d = desc(c, c.rank);
  d.fp = fp;
  d.header = header;
  d.eager = step0.size() <= kEagerBytes;
  if (d.eager && !step0.empty() && !(skip_dry_ && touches_dry(d.data, step0.data())))
    copy_small(d.data, step0.data(), step0.size());
  d.step0 = StepMessage{d.eager ? d.data : step0.data(), nullptr, 0, step0.size()};
  // release: publishes the fields above and step 0's message (Descriptor::stamp).
  d.stamp.store(descriptor_stamp(c.seq), std::memory_order_release);
  c.exposed = !d.eager;
  c.posted = 0;
  publish(c, 0);
}

void SharedMemoryTransport::open(CallState& c, const Fingerprint& fp, const CallHeader& header,
                                 std::span<const std::byte> step0) {
  enter(c, fp, header, step0, /*rooted=*/false);
  // Ownership of this rank's next descriptor line, asked for now (a hint: no access, no
  // ordering), so the next call's writes do not wait for the members' copies to be invalidated.
  __builtin_prefetch(&slot(c, c.rank).desc[(c.seq + 1) % kDescriptors], 1, 3);
  for (int i = 1; i < c.size; ++i) {
    // Meet the ranks after this one first: spreads the initial polling over the group.
    wait_stage(c, (c.rank + i) % c.size, step_stage(0));
  }
}

bool SharedMemoryTransport::open_rooted(CallState& c, const Fingerprint& fp,
                                        const CallHeader& header,
                                        std::span<const std::byte> step0) {
  // Every member decides alike from its own fingerprint; members whose fingerprints differ are
  // caught below or when the call is settled.
  if (fp.count * dtype_size(fp.dtype) > kEagerBytes || fp.root < 0 || fp.root >= c.size) {
    open(c, fp, header, step0);
    return true;
  }
  enter(c, fp, header, step0, /*rooted=*/true);
  Slot& own = slot(c, c.rank);
  // The receiver of a two-member group compares the only other fingerprint itself (below), and
  // never runs ahead of the root it waits for: nothing of this call is left for it to settle.
  if (c.rank == fp.root || c.size > 2) {
    if (own.unmet_first == 0) {
      own.unmet_first = c.seq;
      ++c.comm->self().unmet_calls;
    }
    own.unmet_last = c.seq;
  }
  // No member exposes a buffer (receivers post nothing, the root's payload is in its mailbox), so
  // nobody waits for a done stage.
  own.unawaited = c.seq;
  // A run of eager broadcasts from one root is the common case: start moving the next call's
  // descriptor line now (line 0: fingerprint, step 0 and a payload of up to kPayloadInLine0 bytes;
  // a longer payload continues in line 1), so its transfer between cores overlaps this call's
  // remaining work instead of stalling the next one. The root asks for ownership of its own
  // (write), the others for a copy of the root's (read). Only a hint: no access, so no ordering is
  // implied.
  const Descriptor& next = slot(c, fp.root).desc[(c.seq + 1) % kDescriptors];
  const auto* next_line1 = reinterpret_cast<const std::byte*>(&next) + 64;
  const bool payload_past_line0 = fp.count * dtype_size(fp.dtype) > kPayloadInLine0;
  if (c.rank == fp.root) {
    __builtin_prefetch(&next, 1, 3);
    if (payload_past_line0) __builtin_prefetch(next_line1, 1, 3);
    return false;
  }
  __builtin_prefetch(&next, 0, 3);
  if (payload_past_line0) __builtin_prefetch(next_line1, 0, 3);
  wait_stage(c, fp.root, step_stage(0));
  const Fingerprint& theirs = desc(c, fp.root).fp;
  if (!(theirs == fp)) {
    // Meet every member, as open() does, so the message is disagreement()'s over all of them (the
    // one every member that meets formats), naming the minority rather than this pair.
    for (int i = 1; i < c.size; ++i) wait_stage(c, (c.rank + i) % c.size, step_stage(0));
    const Fingerprint* fps[kMaxRanks];
    for (int r = 0; r < c.size; ++r) fps[r] = &desc(c, r).fp;
    raise(c.comm->self(), CollectiveMismatch(disagreement(c.comm->name(), c.seq, c.size, fps,
                                                          /*counts_must_match=*/true)));
  }
  return false;
}

void SharedMemoryTransport::settle(RankState& self) {
  if (self.unmet_calls == 0) return;
  WorldShared& w = *self.world;
  std::vector<std::shared_ptr<Group>> groups{w.world_group};
  {
    std::lock_guard<std::mutex> lock(w.groups_mu);
    groups.insert(groups.end(), w.run_groups.begin(), w.run_groups.end());
  }
  for (const auto& g : groups) {
    const auto at = std::find(g->world_ranks.begin(), g->world_ranks.end(), self.rank);
    if (at == g->world_ranks.end()) continue;
    const int me = static_cast<int>(at - g->world_ranks.begin());
    settle_unmet(self, *g, me, g->slots[static_cast<std::size_t>(me)].unmet_last);
  }
}

const Fingerprint& SharedMemoryTransport::fingerprint(const CallState& c, int member) const {
  return desc(c, member).fp;
}

const CallHeader& SharedMemoryTransport::header(const CallState& c, int member) const {
  return desc(c, member).header;
}

void SharedMemoryTransport::post(CallState& c, int step, std::span<const std::byte> data) {
  check_step(c, step);
  Descriptor& d = desc(c, c.rank);
  for (int s = c.posted + 1; s < step; ++s) d.step(s) = StepMessage{};
  d.step(step) = StepMessage{data.data(), nullptr, 0, data.size()};
  c.exposed = c.exposed || !data.empty();
  c.posted = step;
  publish(c, step);
}

void SharedMemoryTransport::post(CallState& c, int step, Pieces pieces) {
  if (pieces.size() == 1) return post(c, step, pieces[0]);
  check_step(c, step);
  Descriptor& d = desc(c, c.rank);
  std::uint64_t bytes = 0;
  for (const auto& p : pieces) bytes += p.size();
  for (int s = c.posted + 1; s < step; ++s) d.step(s) = StepMessage{};
  d.step(step) = StepMessage{nullptr, pieces.data(), pieces.size(), bytes};
  c.exposed = c.exposed || bytes > 0;
  c.posted = step;
  publish(c, step);
}

void SharedMemoryTransport::recv(CallState& c, int from, int step, std::size_t offset,
                                 std::span<std::byte> dst) {
  if (from == c.rank) {
    if (step > c.posted) throw std::logic_error("recv of this rank's own step before posting it");
    copy_range(c, from, step, desc(c, from).step(step), offset, dst, skip_dry_);
    return;
  }
  if (step > 0) wait_stage(c, from, step_stage(step));  // step 0: every member met in open
  if (dst.empty()) return;
  const Descriptor& d = desc(c, from);
  if (in_mailbox(d, step) && !skip_dry_ && offset + dst.size() <= d.step0.bytes) {
    // The eager copy (every small broadcast's payload): one small copy, nothing to hold.
    copy_small(dst.data(), d.data + offset, dst.size());
    return;
  }
  if (!in_mailbox(d, step)) begin_reading(c.comm->self(), c.op);
  copy_range(c, from, step, d.step(step), offset, dst, skip_dry_);
}

bool SharedMemoryTransport::recv_all_step0(CallState& c, std::byte* dst, const std::size_t* offsets,
                                           std::size_t elem_size) {
  // Each member's descriptor of this call, looked up once for both passes.
  const Slot* slots = c.comm->group().slots.get();
  const std::uint64_t entry = c.seq % kDescriptors;
  for (int r = 0; r < c.size; ++r) {
    const Descriptor& d = slots[r].desc[entry];
    if (!d.eager || d.step0.bytes != (offsets[r + 1] - offsets[r]) * elem_size) return false;
  }
  // Mailbox copies only: no reading flag, and they outlive the call.
  for (int r = 0; r < c.size; ++r) {
    const Descriptor& d = slots[r].desc[entry];
    std::byte* to = dst + offsets[r] * elem_size;
    if (d.step0.bytes != 0 && !(skip_dry_ && touches_dry(to, d.data)))
      copy_small(to, d.data, d.step0.bytes);
  }
  return true;
}

void SharedMemoryTransport::recv_rows(CallState& c, int from, int step, std::size_t offset,
                                      std::size_t stride, std::size_t row_bytes, std::size_t rows,
                                      std::byte* dst, std::size_t dst_stride) {
  if (from == c.rank && step > c.posted)
    throw std::logic_error("recv of this rank's own step before posting it");
  if (from != c.rank && step > 0) wait_stage(c, from, step_stage(step));
  if (rows == 0 || row_bytes == 0) return;
  const Descriptor& d = desc(c, from);
  const StepMessage& m = d.step(step);
  if (from != c.rank && !in_mailbox(d, step)) begin_reading(c.comm->self(), c.op);
  for (std::size_t i = 0; i < rows; ++i)
    copy_range(c, from, step, m, offset + i * stride, {dst + i * dst_stride, row_bytes}, skip_dry_);
}

void SharedMemoryTransport::recv_reduce(CallState& c, int step, std::size_t offset,
                                        std::size_t count, Dtype dtype, std::byte* acc) {
  const int n = c.size;
  if (step > 0)
    for (int i = 1; i < n; ++i) wait_stage(c, (c.rank + i) % n, step_stage(step));
  const std::size_t bytes = count * dtype_size(dtype);
  if (bytes == 0) return;
  const std::byte* srcs[kMaxRanks];
  if (step == 0 && !skip_dry_) {
    // A small call (all_reduce up to kSmallMessageBytes): every member's range in its mailbox copy
    // is summed straight from there, without locating it piece by piece. The same sum in the same
    // rank order as below; anything else (a range beyond a message) takes the checked path.
    const Slot* slots = c.comm->group().slots.get();
    const std::uint64_t entry = c.seq % kDescriptors;
    // A member's source is formed only once its range is known to lie inside its mailbox copy:
    // d.data + offset past the copy's end would be a pointer outside the array (undefined).
    bool mailboxes = true;
    for (int r = 0; r < n && mailboxes; ++r) {
      const Descriptor& d = slots[r].desc[entry];
      mailboxes = d.eager && offset + bytes <= d.step0.bytes;
      if (mailboxes) srcs[r] = d.data + offset;
    }
    if (mailboxes) {
      sum_ranks_into(dtype, acc, srcs, n, count);
      return;
    }
  }
  sum_members(c, step, offset, count, dtype, acc, nullptr);
}

void SharedMemoryTransport::sum_members(CallState& c, int step, std::size_t offset,
                                        std::size_t count, Dtype dtype, std::byte* acc,
                                        const std::byte* const* copied) {
  const int n = c.size;
  const std::size_t bytes = count * dtype_size(dtype);
  const std::byte* srcs[kMaxRanks];
  const StepMessage* msgs[kMaxRanks];
  bool in_place = false;  // some member's message is read from its own buffer
  for (int r = 0; r < n; ++r) {
    if (copied != nullptr && copied[r] != nullptr) continue;
    const Descriptor& d = desc(c, r);
    msgs[r] = &d.step(step);
    in_place = in_place || (r != c.rank && !in_mailbox(d, step));
  }
  if (in_place) begin_reading(c.comm->self(), c.op);
  // One pass per run of bytes contiguous in every member's message (all of it, unless the
  // messages are made of pieces).
  for (std::size_t done = 0; done < bytes;) {
    std::size_t run = bytes - done;
    for (int r = 0; r < n; ++r) {
      if (copied != nullptr && copied[r] != nullptr) {
        srcs[r] = copied[r] + done;
        continue;
      }
      const auto [p, avail] = locate(*msgs[r], offset + done);
      if (p == nullptr) out_of_range(c, r, step, offset, bytes, msgs[r]->bytes);
      srcs[r] = p;
      run = std::min(run, avail);
    }
    bool dry = false;
    for (int r = 0; skip_dry_ && r < n; ++r) dry = dry || touches_dry(acc + done, srcs[r]);
    if (!dry) sum_ranks_into(dtype, acc + done, srcs, n, run / dtype_size(dtype));
    done += run;
  }
}

void SharedMemoryTransport::finish(CallState& c) {
  end_reading(c.comm->self());
  c.finished = true;
  if (slot(c, c.rank).unawaited == c.seq || !any_member_exposes(c)) return;
  // As in publish: the done stage, which releases our reads of the members' buffers.
  store_waited(slot(c, c.rank).progress, stage_value(c.seq, kDoneStage));
  unpark_members(c.comm->group(), c.rank);
  if (!c.exposed) return;
  try {
    for (int i = 1; i < c.size; ++i) wait_stage(c, (c.rank + i) % c.size, kDoneStage);
  } catch (...) {
    wait_all_done_after_abort(c);
    throw;
  }
}

void SharedMemoryTransport::abandon(CallState& c) noexcept {
  // Lowered first: a member aborting at the same time may be waiting for it.
  end_reading(c.comm->self());
  if (c.exposed && !c.finished) wait_all_done_after_abort(c);
}

void SharedMemoryTransport::wait_stage(CallState& c, int member, std::uint64_t stage) {
  const std::uint64_t target = stage_value(c.seq, stage);
  Slot& own = slot(c, c.rank);
  // A member seen ahead of this call before needs no load (nor its line): that earlier seq_cst
  // load already acquired everything it published up to the value seen. Ready: no wait, so the
  // reading flag may stay up.
  if (own.seen_member == member && own.seen_progress >= target) return;
  // Step 0 of a member of this process: its descriptor of this call stamped (Descriptor::stamp).
  // Null otherwise: another process's rank has a mirror here, which only progress publishes.
  const std::atomic<std::uint32_t>* stamp =
      stage == step_stage(0) && c.comm->self().world->hosts(world_rank_of(*c.comm, member))
          ? &desc(c, member).stamp
          : nullptr;
  const std::uint32_t stamped = descriptor_stamp(c.seq);
  // acquire: pairs with the member's release store in enter(); its descriptor and step 0 are
  // visible.
  if (stamp != nullptr && stamp->load(std::memory_order_acquire) == stamped) return;
  auto& progress = slot(c, member).progress;
  if (const int spins = c.comm->self().world->stamp_spin_iterations;
      stamp != nullptr && spins > 0) {
    // A first spin on the stamp alone, leaving the member's progress line to it: a copy of that
    // line here would make the member's progress store, right after its stamp, wait for the copy
    // to be invalidated, and its next call's stores queue behind that one (measured on small
    // calls: docs/benchmarks.md). Never with the reading flag up (see below); then, as for any
    // stage, progress and the wait.
    end_reading(c.comm->self());
    for (int i = 0; i < spins; ++i) {
      cpu_relax();
      if (stamp->load(std::memory_order_acquire) == stamped) return;
    }
  }
  // seq_cst: as in the wait below.
  if (const std::uint64_t p = progress.load(std::memory_order_seq_cst); p >= target) {
    own.seen_member = member;
    own.seen_progress = p;
    return;
  }
  // Never wait with the flag up: the member may be aborting and waiting for it to drop.
  end_reading(c.comm->self());
  c.op.stage = stage == step_stage(0) ? "every member to enter"
               : stage == kDoneStage  ? "every member to finish"
                                      : "a member's next step";
  // seq_cst load: acquires the member's descriptor and step messages (pairs with its seq_cst
  // store) and is the load half of the Parker handshake.
  // The stamp (acquire, as above) is only a shortcut: progress, stored after it, is still loaded
  // whenever the stamp is not there, so a rank that parks has seen progress short (Parker).
  wait_until(c.comm->self(), world_rank_of(*c.comm, member), c.op, [&] {
    return (stamp != nullptr && stamp->load(std::memory_order_acquire) == stamped) ||
           progress.load(std::memory_order_seq_cst) >= target;
  });
}

void SharedMemoryTransport::wait_all_done_after_abort(CallState& c) noexcept {
  // The world is aborting (every throwing path raised it first). Our buffers may still be read by
  // a member that began reading before it saw the abort; such a read is a bounded copy. A member
  // not reading now never will (begin_reading rechecks the abort), so wait only for those.
  const std::uint64_t done = stage_value(c.seq, kDoneStage);
  const Group& g = c.comm->group();
  for (int r = 0; r < c.size; ++r) {
    if (r == c.rank) continue;
    const RankState& peer =
        *g.world->ranks[static_cast<std::size_t>(g.world_ranks[static_cast<std::size_t>(r)])];
    // seq_cst: the exposer half of the RankState::reading handshake.
    while (slot(c, r).progress.load(std::memory_order_seq_cst) < done &&
           peer.reading.load(std::memory_order_seq_cst))
      std::this_thread::yield();
  }
}

bool SharedMemoryTransport::send(Comm& comm, int dst, std::uint64_t index,
                                 const MessageHeader& header, std::span<const std::byte> data,
                                 const OpRef& op) {
  Channel& ch = comm.group().channel(comm.rank(), dst);
  if (index >= kChannelDepth) {
    // seq_cst: pairs with the receiver's seq_cst store of `consumed` (frees slot index % depth).
    wait_until(comm.self(), world_rank_of(comm, dst), op, [&] {
      return ch.consumed.load(std::memory_order_seq_cst) >= index + 1 - kChannelDepth;
    });
  }
  P2PMessage& msg = ch.ring[index % kChannelDepth];
  msg.header = header;
  msg.bytes = data.size();
  msg.eager = data.size() <= kEagerBytes;
  msg.data_ptr = data.data();
  if (msg.eager && !data.empty() && !(skip_dry_ && touches_dry(msg.data, data.data())))
    copy_small(msg.data, data.data(), data.size());
  // relaxed: published to the receiver by the seq_cst store of `posted` below.
  msg.state.store(kPosted, std::memory_order_relaxed);
  ch.posted.store(index + 1, std::memory_order_seq_cst);
  state_of(comm, dst).parker.unpark();
  return msg.eager;
}

void SharedMemoryTransport::wait_sent(Comm& comm, int dst, std::uint64_t index, const OpRef& op) {
  Channel& ch = comm.group().channel(comm.rank(), dst);
  wait_until(comm.self(), world_rank_of(comm, dst), op,
             [&] { return message_consumed(ch, index); });
}

bool SharedMemoryTransport::withdraw_send(Comm& comm, int dst, std::uint64_t index) noexcept {
  Channel& ch = comm.group().channel(comm.rank(), dst);
  // If the message was already consumed, its slot may hold a later message of ours; the CAS below
  // would withdraw that one instead. Only this thread posts to the slot, so if the message is not
  // consumed now, the slot still holds it.
  if (message_consumed(ch, index)) return true;
  P2PMessage& msg = ch.ring[index % kChannelDepth];
  std::uint32_t expected = kPosted;
  // acq_rel: if the receiver already took the message (CAS fails), wait for its bounded copy.
  if (!msg.state.compare_exchange_strong(expected, kWithdrawn, std::memory_order_acq_rel)) {
    // kTaken (the receiver is copying) or kConsumed.
    while (!message_consumed(ch, index)) std::this_thread::yield();
  }
  return false;
}

bool SharedMemoryTransport::arrived(const Comm& comm, int src, std::uint64_t index) const {
  // seq_cst: pairs with the sender's store of `posted`.
  return comm.group().channel(src, comm.rank()).posted.load(std::memory_order_seq_cst) >= index + 1;
}

const MessageHeader& SharedMemoryTransport::wait_message(Comm& comm, int src, std::uint64_t index,
                                                         const OpRef& op) {
  Channel& ch = comm.group().channel(src, comm.rank());
  // seq_cst: pairs with the sender's store of `posted`, publishing the message slot.
  wait_until(comm.self(), world_rank_of(comm, src), op,
             [&] { return ch.posted.load(std::memory_order_seq_cst) >= index + 1; });
  return ch.ring[index % kChannelDepth].header;
}

void SharedMemoryTransport::take(Comm& comm, int src, std::uint64_t index, std::span<std::byte> dst,
                                 const OpRef& op) {
  RankState& self = comm.self();
  Channel& ch = comm.group().channel(src, comm.rank());
  P2PMessage& msg = ch.ring[index % kChannelDepth];
  if (msg.eager) {
    if (!dst.empty() && !(skip_dry_ && touches_dry(dst.data(), msg.data)))
      copy_small(dst.data(), msg.data, dst.size());
  } else {
    std::uint32_t expected = kPosted;
    // acq_rel: taking the message excludes the sender's withdrawal (see P2PMessage::state).
    if (!msg.state.compare_exchange_strong(expected, kTaken, std::memory_order_acq_rel)) {
      // The sender withdraws while unwinding, before its exception reaches World's handler and
      // raises the abort. Throwing at once would let this rank's PeerFailure become the run's
      // "first failure", misnaming the failing rank. Wait (bounded by the hang timeout and the
      // sender's departure) for the abort so the error names the sender's failure.
      wait_until(self, world_rank_of(comm, src), op, [] { return false; });
      throw PeerFailure("recv #" + std::to_string(index + 1) + " on group " + comm.name() +
                        ": rank " + std::to_string(src) + " withdrew its message");
    }
    if (!(skip_dry_ && touches_dry(dst.data(), msg.data_ptr)))
      std::memcpy(dst.data(), msg.data_ptr, dst.size());
  }
  // Mark this message, then advance the count over the leading taken messages: receives from
  // one peer may complete out of order, and the count must never move backwards (the sender of a
  // later message would then wait forever). Only this thread writes `consumed` and `taken`, so a
  // relaxed load sees our own earlier store.
  if (!msg.eager) msg.state.store(kConsumed, std::memory_order_seq_cst);
  ch.taken[index % kChannelDepth] = index + 1;
  std::uint64_t leading = ch.consumed.load(std::memory_order_relaxed);
  while (ch.taken[leading % kChannelDepth] == leading + 1) ++leading;
  ch.consumed.store(leading, std::memory_order_seq_cst);
  state_of(comm, src).parker.unpark();
}

}  // namespace tspemu::detail
