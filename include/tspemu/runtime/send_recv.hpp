// Point-to-point messages: send/recv, their non-blocking forms isend/irecv, and sendrecv (one
// ring step: send to one neighbour while receiving from the other).
//
// Matching: the k-th message rank a sends to rank b on a group is the k-th that b receives from a
// (per-pair FIFO, no tags). Type and count must agree, else both ranks fail with
// CollectiveMismatch naming the two calls.
// Buffers: a send's buffer must stay unchanged until the send completes (SendHandle::wait); the
// receiver copies straight out of it (single copy). Messages of at most 256 bytes are copied into
// the mailbox at isend and complete at once. A recv's buffer is written during RecvHandle::wait.
// Up to 4 messages per ordered pair may be in flight; a fifth isend waits for the first to be
// received.
// Handles: wait() completes the operation; a handle destroyed unwaited waits in its destructor
// (a send being unwound by an exception is withdrawn instead, so the receiver fails, not reads; a
// receive being unwound is abandoned, its buffer untouched).
// Cost: one copy of the message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/dtype.hpp"

namespace tspemu {

class SendHandle {
 public:
  SendHandle() = default;
  SendHandle(SendHandle&& o) noexcept { *this = std::move(o); }
  SendHandle& operator=(SendHandle&& o) noexcept;
  ~SendHandle();
  void wait();
  bool done() const { return comm_ == nullptr; }

 private:
  friend SendHandle isend_bytes(Comm&, const std::byte*, std::size_t, Dtype, int);
  void withdraw_or_wait() noexcept;
  Comm* comm_ = nullptr;  // null once complete
  int peer_ = -1;
  std::uint64_t index_ = 0;
  std::uint64_t record_ = 0;  // flight recorder id
};

class RecvHandle {
 public:
  RecvHandle() = default;
  RecvHandle(RecvHandle&& o) noexcept { *this = std::move(o); }
  RecvHandle& operator=(RecvHandle&& o) noexcept;
  ~RecvHandle();
  void wait();
  bool done() const { return comm_ == nullptr; }
  // True once the message is in the mailbox (wait() will not block on the sender), or done().
  bool arrived() const;

 private:
  friend RecvHandle irecv_bytes(Comm&, std::byte*, std::size_t, Dtype, int);
  friend std::size_t wait_any(std::span<RecvHandle> handles);
  void complete(Comm& comm);
  Comm* comm_ = nullptr;
  int peer_ = -1;
  std::uint64_t index_ = 0;
  std::byte* buf_ = nullptr;
  std::size_t count_ = 0;
  Dtype dtype_ = Dtype::byte;
  std::uint64_t record_ = 0;  // flight recorder id
};

SendHandle isend_bytes(Comm& comm, const std::byte* data, std::size_t count, Dtype dtype, int dst);
RecvHandle irecv_bytes(Comm& comm, std::byte* data, std::size_t count, Dtype dtype, int src);

// Completes one pending receive of `handles` and returns its index. Without injection: the first
// (lowest index) whose message has arrived, blocking until one has, so the order follows thread
// timing; under injection (injection.hpp): a pending one chosen from the rank's seeded stream, so
// the delivery order is the seed's. A result that depends on this order is a schedule bug that
// check_deterministic finds. Throws std::invalid_argument if none is pending.
std::size_t wait_any(std::span<RecvHandle> handles);

template <class T>
[[nodiscard]] SendHandle isend(Comm& comm, std::span<const std::type_identity_t<T>> data, int dst) {
  return isend_bytes(comm, reinterpret_cast<const std::byte*>(data.data()), data.size(),
                     dtype_of<T>(), dst);
}
template <class T>
[[nodiscard]] RecvHandle irecv(Comm& comm, std::span<std::type_identity_t<T>> data, int src) {
  return irecv_bytes(comm, reinterpret_cast<std::byte*>(data.data()), data.size(), dtype_of<T>(),
                     src);
}
template <class T>
void send(Comm& comm, std::span<const std::type_identity_t<T>> data, int dst) {
  isend<T>(comm, data, dst).wait();
}
template <class T>
void recv(Comm& comm, std::span<std::type_identity_t<T>> data, int src) {
  irecv<T>(comm, data, src).wait();
}
// One ring step: send `out` to dst while receiving `in` from src; out and in must not overlap.
template <class T>
void sendrecv(Comm& comm, std::span<const std::type_identity_t<T>> out, int dst,
              std::span<std::type_identity_t<T>> in, int src) {
  // The "must not overlap" rule, checked: an overlap would silently corrupt `in`.
  const auto* ob = reinterpret_cast<const std::byte*>(out.data());
  const auto* ib = reinterpret_cast<const std::byte*>(in.data());
  if (!out.empty() && !in.empty() && ob < ib + in.size_bytes() && ib < ob + out.size_bytes())
    throw std::invalid_argument("sendrecv on group " + comm.name() +
                                ": out and in overlap (to rank " + std::to_string(dst) +
                                ", from rank " + std::to_string(src) + ")");
  SendHandle s = isend<T>(comm, out, dst);
  RecvHandle r = irecv<T>(comm, in, src);
  r.wait();
  s.wait();
}

}  // namespace tspemu
