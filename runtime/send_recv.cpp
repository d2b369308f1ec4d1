#include "tspemu/runtime/send_recv.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "arguments.hpp"
#include "state.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu {

using detail::Channel;
using detail::OpRef;
using detail::P2PMessage;

namespace {

void check_peer(const Comm& c, const char* op, int peer) {
  detail::check_comm(c, op);
  if (peer < 0 || peer >= c.size())
    detail::bad_argument(c, op,
                         "peer " + std::to_string(peer) + " is outside the group of " +
                             std::to_string(c.size()) + " ranks");
}

detail::RankState& state_of(const Comm& c, int group_rank) {
  return *c.group().world->ranks[static_cast<std::size_t>(c.world_rank(group_rank))];
}

}  // namespace

SendHandle isend_bytes(Comm& comm, const std::byte* data, std::size_t count, Dtype dtype, int dst) {
  check_peer(comm, "send", dst);
  detail::RankState& self = comm.self();
  detail::inject_delay(self);  // the rank
  const std::int64_t trace_begin = self.trace ? self.world->now_ns() : 0;
  const std::size_t bytes = count * dtype_size(dtype);
  const std::uint64_t m = comm.sends_to(dst)++;
  Channel& ch = comm.group().channel(comm.rank(), dst);
  OpRef op{"send", m + 1, &comm.group(), dst, "a free mailbox slot", bytes};
  const std::uint64_t record = detail::record_begin(comm.self(), "send", m + 1, comm.group(),
                                                    comm.world_rank(dst), -1, bytes);
  if (m >= detail::kChannelDepth) {
    // seq_cst: pairs with the receiver's seq_cst store of `consumed` (frees slot m % depth).
    detail::wait_until(comm.self(), comm.world_rank(dst), op, [&] {
      return ch.consumed.load(std::memory_order_seq_cst) >= m + 1 - detail::kChannelDepth;
    });
  }
  P2PMessage& msg = ch.ring[m % detail::kChannelDepth];
  msg.fp = {CollectiveKind::send, dtype, -1, count};
  msg.bytes = bytes;
  msg.eager = bytes <= detail::kEagerBytes;
  msg.data_ptr = data;
  if (msg.eager && bytes > 0) std::memcpy(msg.data, data, bytes);
  const std::uint64_t flow = self.trace ? self.trace->next_flow(self.rank) : 0;
  msg.flow = flow;
  const SimClockModel* sim = detail::sim_model(self);
  msg.sim_arrival_ns = sim ? self.sim_ns + detail::sim_ns_of(sim->message_seconds(bytes)) : 0;
  detail::inject_delay(self);  // the message
  // relaxed: published to the receiver by the seq_cst store of `posted` below.
  msg.state.store(detail::kPosted, std::memory_order_relaxed);
  ch.posted.store(m + 1, std::memory_order_seq_cst);
  state_of(comm, dst).parker.unpark();
  detail::count_traffic(comm, CollectiveKind::send, dst == comm.rank() ? 0 : bytes, 0);
  if (self.trace) {
    const std::int64_t sim_now = sim ? self.sim_ns : -1;  // the copy does not hold the sender
    self.trace->record(TraceEvent{TraceEvent::Type::send, "send", m + 1, comm.group().id,
                                  comm.world_rank(dst), -1, bytes, 0, flow, trace_begin,
                                  self.world->now_ns(), sim_now, sim_now});
  }
  SendHandle h;
  if (!msg.eager) {
    h.comm_ = &comm;
    h.peer_ = dst;
    h.index_ = m;
    h.record_ = record;
  } else {
    detail::record_end(comm.self(), record, true);
  }
  return h;
}

SendHandle& SendHandle::operator=(SendHandle&& o) noexcept {
  if (this != &o) {
    if (comm_ != nullptr) withdraw_or_wait();
    comm_ = std::exchange(o.comm_, nullptr);
    peer_ = o.peer_;
    index_ = o.index_;
    record_ = o.record_;
  }
  return *this;
}

void SendHandle::wait() {
  if (comm_ == nullptr) return;
  Comm& comm = *comm_;
  detail::RankState& self = comm.self();
  const std::int64_t trace_begin = self.trace ? self.world->now_ns() : 0;
  Channel& ch = comm.group().channel(comm.rank(), peer_);
  OpRef op{"send", index_ + 1, &comm.group(), peer_, "the receiver to copy", 0};
  try {
    // seq_cst: pairs with the receiver's store of `consumed`; its copy is finished.
    detail::wait_until(comm.self(), comm.world_rank(peer_), op,
                       [&] { return detail::message_consumed(ch, index_); });
  } catch (...) {
    withdraw_or_wait();
    throw;
  }
  comm_ = nullptr;
  detail::record_end(self, record_, true);
  if (self.trace) {
    const std::int64_t sim_now = detail::sim_model(self) ? self.sim_ns : -1;
    self.trace->record(TraceEvent{TraceEvent::Type::send, "send wait", index_ + 1, comm.group().id,
                                  comm.world_rank(peer_), -1, 0, 0, 0, trace_begin,
                                  self.world->now_ns(), sim_now, sim_now});
  }
}

void SendHandle::withdraw_or_wait() noexcept {
  Comm& comm = *comm_;
  Channel& ch = comm.group().channel(comm.rank(), peer_);
  // Fix: if the message was already consumed, its slot may hold a later message of ours; the CAS
  // below would withdraw that one instead (and a later withdraw_or_wait of it would then wait
  // forever). seq_cst: pairs with the receiver's store of `consumed`. Only this thread posts to
  // the slot, so if the message is not consumed now, the slot still holds it.
  if (detail::message_consumed(ch, index_)) {
    comm_ = nullptr;
    detail::record_end(comm.self(), record_, true);
    return;
  }
  P2PMessage& msg = ch.ring[index_ % detail::kChannelDepth];
  std::uint32_t expected = detail::kPosted;
  // acq_rel: if the receiver already took the message (CAS fails), wait for its bounded copy.
  if (!msg.state.compare_exchange_strong(expected, detail::kWithdrawn, std::memory_order_acq_rel)) {
    // kTaken (the receiver is copying) or kConsumed: wait for the bounded copy.
    while (!detail::message_consumed(ch, index_)) std::this_thread::yield();
  }
  comm_ = nullptr;
  detail::record_end(comm.self(), record_, false);
}

SendHandle::~SendHandle() {
  if (comm_ == nullptr) return;
  if (std::uncaught_exceptions() == 0) {
    try {
      wait();
      return;
    } catch (...) {
      // wait() already withdrew or finished the message; a destructor cannot report further.
      return;
    }
  }
  withdraw_or_wait();
}

RecvHandle irecv_bytes(Comm& comm, std::byte* data, std::size_t count, Dtype dtype, int src) {
  check_peer(comm, "recv", src);
  RecvHandle h;
  h.comm_ = &comm;
  h.peer_ = src;
  h.index_ = comm.recvs_from(src)++;
  h.buf_ = data;
  h.count_ = count;
  h.dtype_ = dtype;
  h.record_ = detail::record_begin(comm.self(), "recv", h.index_ + 1, comm.group(),
                                   comm.world_rank(src), -1, count * dtype_size(dtype));
  return h;
}

RecvHandle& RecvHandle::operator=(RecvHandle&& o) noexcept {
  if (this != &o) {
    if (comm_ != nullptr) {
      try {
        wait();
      } catch (...) {
      }
    }
    comm_ = std::exchange(o.comm_, nullptr);
    peer_ = o.peer_;
    index_ = o.index_;
    buf_ = o.buf_;
    count_ = o.count_;
    dtype_ = o.dtype_;
    record_ = o.record_;
  }
  return *this;
}

RecvHandle::~RecvHandle() {
  if (comm_ == nullptr) return;
  // Fix: a receive being unwound by an exception is abandoned, not waited for. Waiting let a
  // throwing rank block in this destructor for a message its peer (itself waiting for the
  // throwing rank) would never send: the run then failed only at the hang timeout, with a
  // HangError from another rank instead of the original exception. The buffer is never written;
  // the sender fails with PeerFailure once the exception aborts the run.
  if (std::uncaught_exceptions() > 0) {
    detail::record_end(comm_->self(), record_, false);
    comm_ = nullptr;
    return;
  }
  try {
    wait();
  } catch (...) {
  }
}

void RecvHandle::wait() {
  if (comm_ == nullptr) return;
  Comm& comm = *comm_;
  comm_ = nullptr;  // complete (or failed) after this call either way
  try {
    complete(comm);
  } catch (...) {
    detail::record_end(comm.self(), record_, false);
    throw;
  }
  detail::record_end(comm.self(), record_, true);
}

void RecvHandle::complete(Comm& comm) {
  detail::RankState& self = comm.self();
  detail::inject_delay(self);
  const std::int64_t trace_begin = self.trace ? self.world->now_ns() : 0;
  Channel& ch = comm.group().channel(peer_, comm.rank());
  OpRef op{"recv", index_ + 1, &comm.group(), peer_, "the message", count_ * dtype_size(dtype_)};
  // seq_cst: pairs with the sender's store of `posted`, publishing the message slot.
  detail::wait_until(self, comm.world_rank(peer_), op,
                     [&] { return ch.posted.load(std::memory_order_seq_cst) >= index_ + 1; });
  P2PMessage& msg = ch.ring[index_ % detail::kChannelDepth];
  if (msg.fp.dtype != dtype_ || msg.fp.count != count_) {
    detail::raise(
        self, CollectiveMismatch(
                  "recv #" + std::to_string(index_ + 1) + " on group " + comm.name() + ": rank " +
                  std::to_string(peer_) + " sent count=" + std::to_string(msg.fp.count) + " " +
                  dtype_name(msg.fp.dtype) + ", rank " + std::to_string(comm.rank()) +
                  " expects count=" + std::to_string(count_) + " " + dtype_name(dtype_)));
  }
  if (msg.eager) {
    if (msg.bytes > 0) std::memcpy(buf_, msg.data, msg.bytes);
  } else {
    std::uint32_t expected = detail::kPosted;
    // acq_rel: taking the message excludes the sender's withdrawal (see P2PMessage::state).
    if (!msg.state.compare_exchange_strong(expected, detail::kTaken, std::memory_order_acq_rel)) {
      // Fix: the sender withdraws while unwinding, before its exception reaches World's handler
      // and raises the abort. Throwing at once let this rank's PeerFailure become the run's
      // "first failure", misnaming the failing rank. Wait (bounded by the hang timeout and the
      // sender's departure) for the abort so the error names the sender's failure.
      detail::wait_until(self, comm.world_rank(peer_), op, [] { return false; });
      throw PeerFailure("recv #" + std::to_string(index_ + 1) + " on group " + comm.name() +
                        ": rank " + std::to_string(peer_) + " withdrew its message");
    }
    std::memcpy(buf_, msg.data_ptr, msg.bytes);
  }
  // Fix (TSan data race): read the message's size before releasing the slot; once `consumed` is
  // stored the sender may reuse it for message index_ + depth and rewrite msg.bytes.
  const std::uint64_t bytes = msg.bytes;
  const std::uint64_t flow = msg.flow;
  const std::int64_t arrival = msg.sim_arrival_ns;
  // Fix: storing index_ + 1 here moved the count backwards when an earlier receive from this peer
  // completed after a later one, and the sender of the later message then waited forever. Mark
  // this message, then advance the count over the leading consumed messages (only this thread
  // writes `consumed` and kConsumed, so relaxed loads see our own earlier stores of them).
  msg.state.store(detail::kConsumed, std::memory_order_seq_cst);
  std::uint64_t leading = ch.consumed.load(std::memory_order_relaxed);
  // seq_cst load of `posted`: pairs with the sender's store; a slot beyond it still holds an old,
  // consumed message, so its state says nothing yet.
  while (leading < ch.posted.load(std::memory_order_seq_cst) &&
         ch.ring[leading % detail::kChannelDepth].state.load(std::memory_order_relaxed) ==
             detail::kConsumed)
    ++leading;
  ch.consumed.store(leading, std::memory_order_seq_cst);
  state_of(comm, peer_).parker.unpark();
  detail::count_traffic(comm, CollectiveKind::recv, 0, peer_ == comm.rank() ? 0 : bytes);
  std::int64_t sim_begin = -1;
  if (detail::sim_model(self)) {
    // A receive ends no earlier than its message arrives on the simulated clock.
    sim_begin = self.sim_ns;
    self.sim_ns = std::max(self.sim_ns, arrival);
  }
  if (self.trace)
    self.trace->record(TraceEvent{TraceEvent::Type::recv, "recv", index_ + 1, comm.group().id,
                                  comm.world_rank(peer_), -1, bytes, 0, flow, trace_begin,
                                  self.world->now_ns(), sim_begin,
                                  sim_begin < 0 ? -1 : self.sim_ns});
}

bool RecvHandle::arrived() const {
  if (comm_ == nullptr) return true;
  // seq_cst: pairs with the sender's store of `posted` (as in complete()).
  return comm_->group().channel(peer_, comm_->rank()).posted.load(std::memory_order_seq_cst) >=
         index_ + 1;
}

std::size_t wait_any(std::span<RecvHandle> handles) {
  std::vector<std::size_t> pending;  // allocation: wait_any is for schedules, not the transport
  for (std::size_t i = 0; i < handles.size(); ++i)
    if (!handles[i].done()) pending.push_back(i);
  if (pending.empty())
    throw std::invalid_argument("wait_any: none of the " + std::to_string(handles.size()) +
                                " receives is pending");
  RecvHandle& first = handles[pending.front()];
  detail::RankState& self = first.comm_->self();
  std::size_t pick = pending.front();
  if (self.world->opts.inject) {
    // Injection: the seed, not the timing, orders the deliveries (injection.hpp).
    pick = pending[self.inject.below(pending.size())];
  } else {
    OpRef op{"recv (wait_any)",
             first.index_ + 1,
             &first.comm_->group(),
             first.peer_,
             "any of the pending messages",
             0};
    detail::wait_until(self, -1, op, [&] {
      for (std::size_t i : pending)
        if (handles[i].arrived()) return true;
      return false;
    });
    for (std::size_t i : pending)
      if (handles[i].arrived()) {
        pick = i;
        break;
      }
  }
  handles[pick].wait();
  return pick;
}

}  // namespace tspemu
