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

inline void check_peer(const Comm& c, const char* op, int peer) {
  detail::check_comm(c, op);
  if (peer < 0 || peer >= c.size()) [[unlikely]]
    detail::bad_rank(c, op, "peer", peer);
}

}  // namespace

namespace {

detail::OpInfo message_op(detail::OpInfo::Kind kind, Comm& comm, std::uint64_t seq, int peer,
                          std::uint64_t bytes, std::uint64_t record) {
  // Designated: each field is stored once (a default-constructed OpInfo then assigned stores the
  // named ones twice; this runs three times per sendrecv).
  return detail::OpInfo{.kind = kind,
                        .what = kind == detail::OpInfo::Kind::recv_post ||
                                        kind == detail::OpInfo::Kind::recv ||
                                        kind == detail::OpInfo::Kind::recv_abandon
                                    ? "recv"
                                    : "send",
                        .seq = seq,
                        .group = &comm.group(),
                        .peer = comm.world_rank(peer),
                        .bytes = bytes,
                        .record = record};
}

}  // namespace

SendHandle isend_bytes(Comm& comm, const std::byte* data, std::size_t count, Dtype dtype, int dst) {
  check_peer(comm, "send", dst);
  const std::size_t bytes = count * dtype_size(dtype);
  const std::uint64_t m = comm.sends_to(dst)++;
  detail::OpInfo info = message_op(detail::OpInfo::Kind::send, comm, m + 1, dst, bytes, 0);
  detail::observe_begin(comm, info);
  OpRef op{"send", m + 1, &comm.group(), dst, "a free mailbox slot", bytes};
  const detail::MessageHeader header{
      {CollectiveKind::send, dtype, -1, count}, info.flow, info.sim_arrival_ns};
  info.completes_record = detail::transport_of(comm).send(comm, dst, m, header, {data, bytes}, op);
  detail::count_traffic(comm, CollectiveKind::send, dst == comm.rank() ? 0 : bytes, 0);
  detail::observe_end(comm, info, true);
  SendHandle h;
  if (!info.completes_record) {
    h.comm_ = &comm;
    h.peer_ = dst;
    h.index_ = m;
    h.record_ = info.record;
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
  detail::OpInfo info =
      message_op(detail::OpInfo::Kind::send_wait, comm, index_ + 1, peer_, 0, record_);
  detail::observe_begin(comm, info);
  OpRef op{"send", index_ + 1, &comm.group(), peer_, "the receiver to copy", 0};
  try {
    detail::transport_of(comm).wait_sent(comm, peer_, index_, op);
  } catch (...) {
    withdraw_or_wait();
    throw;
  }
  comm_ = nullptr;
  detail::observe_end(comm, info, true);
}

void SendHandle::withdraw_or_wait() noexcept {
  Comm& comm = *comm_;
  const bool received = detail::transport_of(comm).withdraw_send(comm, peer_, index_);
  comm_ = nullptr;
  detail::OpInfo info =
      message_op(detail::OpInfo::Kind::send_withdraw, comm, index_ + 1, peer_, 0, record_);
  detail::observe_end(comm, info, received);
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
  detail::OpInfo info = message_op(detail::OpInfo::Kind::recv_post, comm, h.index_ + 1, src,
                                   count * dtype_size(dtype), 0);
  detail::observe_begin(comm, info);
  h.record_ = info.record;
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
  // A receive being unwound by an exception is abandoned, not waited for. Waiting would let a
  // throwing rank block in this destructor for a message its peer (itself waiting for the
  // throwing rank) would never send: the run would fail only at the hang timeout, with a
  // HangError from another rank instead of the original exception. The buffer is never written;
  // the sender fails with PeerFailure once the exception aborts the run.
  if (std::uncaught_exceptions() > 0) {
    detail::OpInfo info = message_op(detail::OpInfo::Kind::recv_abandon, *comm_, index_ + 1, peer_,
                                     count_ * dtype_size(dtype_), record_);
    detail::observe_end(*comm_, info, false);
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
  complete(comm);
}

void RecvHandle::complete(Comm& comm) {
  const std::size_t bytes = count_ * dtype_size(dtype_);
  detail::OpInfo info =
      message_op(detail::OpInfo::Kind::recv, comm, index_ + 1, peer_, bytes, record_);
  detail::observe_begin(comm, info);
  try {
    detail::Transport& transport = detail::transport_of(comm);
    OpRef op{"recv", index_ + 1, &comm.group(), peer_, "the message", bytes};
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
    transport.take(comm, peer_, index_, {buf_, bytes}, op);
    info.flow = header.flow;
    info.sim_arrival_ns = header.sim_arrival_ns;
  } catch (...) {
    detail::observe_end(comm, info, false);
    throw;
  }
  detail::count_traffic(comm, CollectiveKind::recv, 0, peer_ == comm.rank() ? 0 : bytes);
  detail::observe_end(comm, info, true);
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
