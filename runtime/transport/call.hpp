// Call: one collective call #seq of a Comm on this rank, the handle the algorithms in
// runtime/collectives/ are written against (the transport's verbs, transport.hpp), plus the rank
// services those algorithms need (traffic counters, failures, the observers of point-to-point
// messages) without seeing the world's state.
//
// Requirements: one Call at a time per Comm, on the rank's own thread; the verbs' rules are the
// transport's (transport.hpp).
// Guarantees: the constructor meets every member and compares fingerprints: every member reaches
// the same verdict and raises the same CollectiveMismatch, naming member 0's call and every
// differing one. It also runs the call's observers (injection delay, flight record, trace span,
// simulated clock: the call starts when its last member arrives). A Call left by an exception
// waits, like finish(), until no member can still read this rank's buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>

#include "transport.hpp"
#include "tspemu/runtime/sim_clock.hpp"
#include "tspemu/runtime/trace.hpp"

namespace tspemu::detail {

class Call {
 public:
  Call(Comm& comm, const Fingerprint& fp, std::span<const std::byte> step0,
       bool counts_must_match = true);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  int rank() const { return st_.rank; }
  int size() const { return st_.size; }
  std::uint64_t seq() const { return st_.seq; }
  const Fingerprint& fingerprint(int member) const { return t_.fingerprint(st_, member); }

  void post(int step, std::span<const std::byte> data) { t_.post(st_, step, data); }
  void post(int step, Pieces pieces) { t_.post(st_, step, pieces); }
  void recv(int from, int step, std::size_t offset, std::span<std::byte> dst) {
    t_.recv(st_, from, step, offset, dst);
  }
  void recv_reduce(int step, std::size_t offset, std::size_t count, Dtype dtype, std::byte* acc) {
    t_.recv_reduce(st_, step, offset, count, dtype, acc);
  }
  void finish();

 private:
  Transport& t_;
  CallState st_;
  int root_ = -1;
  std::uint64_t record_ = 0;  // flight recorder id
  bool recorded_end_ = false;
  std::int64_t trace_begin_ns_ = 0;
  std::int64_t sim_begin_ns_ = -1;
  std::int64_t sim_end_ns_ = -1;
};

// Rank services for the algorithms (implemented over the world's state in call.cpp).
Transport& transport_of(Comm& comm);
std::uint64_t group_id(const Comm& comm);
void count_traffic(Comm& comm, CollectiveKind kind, std::size_t sent, std::size_t received);
// Records a runtime failure detected by this rank as the run's failure and aborts the world.
void fail_world(Comm& comm, const std::string& message, std::exception_ptr error);
template <class E>
[[noreturn]] void raise(Comm& comm, const E& error) {
  fail_world(comm, error.what(), std::make_exception_ptr(error));
  throw error;
}

// Waits until ready() holds (the runtime's one waiting policy: spin, yield, park; polling the
// abort flag and the hang timeout). For waits on several messages at once (wait_any).
void wait_for(Comm& comm, const OpRef& op, const std::function<bool()>& ready);

// Observers of point-to-point messages (send_recv.cpp).
void inject_delay(Comm& comm);
bool injecting(const Comm& comm);
std::size_t inject_below(Comm& comm, std::size_t n);  // a draw from the rank's seeded stream
std::uint64_t record_begin(Comm& comm, const char* what, std::uint64_t seq, int peer,
                           std::uint64_t bytes);
void record_end(Comm& comm, std::uint64_t id, bool ok);
bool tracing(const Comm& comm);
std::int64_t now_ns(const Comm& comm);
std::uint64_t next_flow(Comm& comm);
void trace_record(Comm& comm, const TraceEvent& event);
const SimClockModel* sim_model(const Comm& comm);
std::int64_t& sim_clock(Comm& comm);  // this rank's simulated clock, ns
inline std::int64_t sim_ns_of(double seconds) {
  return static_cast<std::int64_t>(seconds * 1e9);
}

}  // namespace tspemu::detail
