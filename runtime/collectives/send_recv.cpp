#include "tspemu/runtime/send_recv.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "arguments.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu {

using detail::OpRef;

namespace {

void check_peer(const Comm& c, const char* op, int peer) {
  detail::check_comm(c, op);
  if (peer < 0 || peer >= c.size())
    detail::bad_argument(c, op,
                         "peer " + std::to_string(peer) + " is outside the group of " +
                             std::to_string(c.size()) + " ranks");
}

}  // namespace

SendHandle isend_bytes(Comm& comm, const std::byte* data, std::size_t count, Dtype dtype, int dst) {
  check_peer(comm, "send", dst);
  detail::inject_delay(comm);  // the rank
  const bool tracing = detail::tracing(comm);
  const std::int64_t trace_begin = tracing ? detail::now_ns(comm) : 0;
  const std::size_t bytes = count * dtype_size(dtype);
  const std::uint64_t m = comm.sends_to(dst)++;
  OpRef op{"send", m + 1, &comm.group(), dst, "a free mailbox slot", bytes};
  const std::uint64_t record =
      detail::record_begin(comm, "send", m + 1, comm.world_rank(dst), bytes);
  detail::MessageHeader header{{CollectiveKind::send, dtype, -1, count}, 0, 0};
  if (tracing) header.flow = detail::next_flow(comm);
  const SimClockModel* sim = detail::sim_model(comm);
  if (sim)
    header.sim_arrival_ns =
        detail::sim_clock(comm) + detail::sim_ns_of(sim->message_seconds(bytes));
  detail::inject_delay(comm);  // the message
  const bool complete = detail::transport_of(comm).send(comm, dst, m, header, {data, bytes}, op);
  detail::count_traffic(comm, CollectiveKind::send, dst == comm.rank() ? 0 : bytes, 0);
  if (tracing) {
    const std::int64_t sim_now =
        sim ? detail::sim_clock(comm) : -1;  // the copy does not hold the sender
    detail::trace_record(comm,
                         TraceEvent{TraceEvent::Type::send, "send", m + 1, detail::group_id(comm),
                                    comm.world_rank(dst), -1, bytes, 0, header.flow, trace_begin,
                                    detail::now_ns(comm), sim_now, sim_now});
  }
  SendHandle h;
  if (!complete) {
    h.comm_ = &comm;
    h.peer_ = dst;
    h.index_ = m;
    h.record_ = record;
  } else {
    detail::record_end(comm, record, true);
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
  const bool tracing = detail::tracing(comm);
  const std::int64_t trace_begin = tracing ? detail::now_ns(comm) : 0;
  OpRef op{"send", index_ + 1, &comm.group(), peer_, "the receiver to copy", 0};
  try {
    detail::transport_of(comm).wait_sent(comm, peer_, index_, op);
  } catch (...) {
    withdraw_or_wait();
    throw;
  }
  comm_ = nullptr;
  detail::record_end(comm, record_, true);
  if (tracing) {
    const std::int64_t sim_now = detail::sim_model(comm) ? detail::sim_clock(comm) : -1;
    detail::trace_record(comm, TraceEvent{TraceEvent::Type::send, "send wait", index_ + 1,
                                          detail::group_id(comm), comm.world_rank(peer_), -1, 0, 0,
                                          0, trace_begin, detail::now_ns(comm), sim_now, sim_now});
  }
}

void SendHandle::withdraw_or_wait() noexcept {
  Comm& comm = *comm_;
  const bool received = detail::transport_of(comm).withdraw_send(comm, peer_, index_);
  comm_ = nullptr;
  detail::record_end(comm, record_, received);
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
  h.record_ = detail::record_begin(comm, "recv", h.index_ + 1, comm.world_rank(src),
                                   count * dtype_size(dtype));
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
    detail::record_end(*comm_, record_, false);
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
    detail::record_end(comm, record_, false);
    throw;
  }
  detail::record_end(comm, record_, true);
}

void RecvHandle::complete(Comm& comm) {
  detail::inject_delay(comm);
  const bool tracing = detail::tracing(comm);
  const std::int64_t trace_begin = tracing ? detail::now_ns(comm) : 0;
  detail::Transport& transport = detail::transport_of(comm);
  OpRef op{"recv", index_ + 1, &comm.group(), peer_, "the message", count_ * dtype_size(dtype_)};
  // A copy: the slot may be reused by the sender once the message is taken.
  const detail::MessageHeader header = transport.wait_message(comm, peer_, index_, op);
  if (header.fp.dtype != dtype_ || header.fp.count != count_) {
    detail::raise(
        comm, CollectiveMismatch(
                  "recv #" + std::to_string(index_ + 1) + " on group " + comm.name() + ": rank " +
                  std::to_string(peer_) + " sent count=" + std::to_string(header.fp.count) + " " +
                  dtype_name(header.fp.dtype) + ", rank " + std::to_string(comm.rank()) +
                  " expects count=" + std::to_string(count_) + " " + dtype_name(dtype_)));
  }
  const std::size_t bytes = count_ * dtype_size(dtype_);
  transport.take(comm, peer_, index_, {buf_, bytes}, op);
  detail::count_traffic(comm, CollectiveKind::recv, 0, peer_ == comm.rank() ? 0 : bytes);
  std::int64_t sim_begin = -1;
  if (detail::sim_model(comm)) {
    // A receive ends no earlier than its message arrives on the simulated clock.
    std::int64_t& clock = detail::sim_clock(comm);
    sim_begin = clock;
    clock = std::max(clock, header.sim_arrival_ns);
  }
  if (tracing)
    detail::trace_record(comm, TraceEvent{TraceEvent::Type::recv, "recv", index_ + 1,
                                          detail::group_id(comm), comm.world_rank(peer_), -1, bytes,
                                          0, header.flow, trace_begin, detail::now_ns(comm),
                                          sim_begin, sim_begin < 0 ? -1 : detail::sim_clock(comm)});
}

bool RecvHandle::arrived() const {
  if (comm_ == nullptr) return true;
  return detail::transport_of(*comm_).arrived(*comm_, peer_, index_);
}

std::size_t wait_any(std::span<RecvHandle> handles) {
  std::vector<std::size_t> pending;  // allocation: wait_any is for schedules, not the transport
  for (std::size_t i = 0; i < handles.size(); ++i)
    if (!handles[i].done()) pending.push_back(i);
  if (pending.empty())
    throw std::invalid_argument("wait_any: none of the " + std::to_string(handles.size()) +
                                " receives is pending");
  RecvHandle& first = handles[pending.front()];
  Comm& comm = *first.comm_;
  std::size_t pick = pending.front();
  if (detail::injecting(comm)) {
    // Injection: the seed, not the timing, orders the deliveries (injection.hpp).
    pick = pending[detail::inject_below(comm, pending.size())];
  } else {
    OpRef op{"recv (wait_any)",
             first.index_ + 1,
             &first.comm_->group(),
             first.peer_,
             "any of the pending messages",
             0};
    detail::wait_for(comm, op, [&] {
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
