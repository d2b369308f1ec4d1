// SimStreams: one rank's two streams on the simulated clock (sim_clock.hpp) — compute and
// communication — and the split of its time into compute, exposed communication (the compute
// stream waits for a transfer) and overlapped communication (a transfer ran while compute did).
//
// What: now_ns() is the compute stream's time, the rank's simulated clock. compute_until charges
// compute; blocking charges a collective the compute stream waits for (issued and waited at
// once: all of it exposed); issue/wait are the entry points of a non-blocking operation — it
// occupies the communication stream from issue (or from when the stream frees) for its
// duration, and its wait exposes only the part that has not finished by then.
// Requirements: one rank's thread only (no synchronization; the clock is per rank); every
// Transfer from issue() is waited once, in any order. Times are whole nanoseconds.
// Guarantees: compute + exposed == now_ns() - (the time the accounting started) when nothing but
// these calls moved the clock; a transfer's overlapped time is the compute that ran during it —
// never the time the compute stream spent waiting (for another collective queued behind it, or
// for another transfer) — so the transfers' overlapped times, disjoint on the communication
// stream, sum to at most compute_ns().
// Cost: O(1) per call but wait(), O(log n) in the number of waits since start_at().
#pragma once

#include <cstdint>
#include <vector>

namespace tspemu {

class SimStreams {
 public:
  // A non-blocking transfer on the communication stream: [begin_ns, end_ns).
  struct Transfer {
    std::int64_t begin_ns = 0;
    std::int64_t end_ns = 0;
  };

  std::int64_t now_ns() const { return now_; }
  // Starts both streams at t (a run starting together); totals are kept.
  void start_at(std::int64_t t);
  // The compute stream runs until end_ns (no-op if end_ns <= now).
  void compute_until(std::int64_t end_ns);
  // A blocking transfer ready at ready_ns (e.g. when the last member arrives) lasting
  // duration_ns: it queues behind the communication stream, and the compute stream waits for it.
  // Returns its interval.
  Transfer blocking(std::int64_t ready_ns, std::int64_t duration_ns);
  // A non-blocking transfer issued now: occupies the communication stream from max(now, when the
  // stream frees) for duration_ns.
  Transfer issue(std::int64_t duration_ns);
  // Waits for t: the compute stream moves to t.end_ns if later (exposed), the rest of t's
  // duration ran under compute (overlapped).
  void wait(const Transfer& t);

  // The clock and its totals without the idle history: what another process needs of a rank
  // it does not host (trivially copyable, sent as bytes). restore() drops the history, so no
  // transfer issued before it may be waited after it.
  struct Snapshot {
    std::int64_t now = 0, comm_free = 0, compute = 0, exposed = 0, overlapped = 0;
  };
  Snapshot snapshot() const { return {now_, comm_free_, compute_, exposed_, overlapped_}; }
  void restore(const Snapshot& s);

  std::int64_t compute_ns() const { return compute_; }
  std::int64_t exposed_comm_ns() const { return exposed_; }
  std::int64_t overlapped_comm_ns() const { return overlapped_; }

 private:
  std::int64_t now_ = 0;        // compute stream
  std::int64_t comm_free_ = 0;  // communication stream free from
  std::int64_t compute_ = 0;    // totals
  std::int64_t exposed_ = 0;
  std::int64_t overlapped_ = 0;
  // The compute stream's idle intervals since start_at (waits: blocking collectives, waits for
  // transfers, the jump of start_at), ascending and disjoint, with the running sum of their
  // lengths up to each one's end: the compute in [a, b) is (b - a) minus the idle part of it.
  struct Idle {
    std::int64_t begin, end, total_to_end;
  };
  std::vector<Idle> idle_;
  void idle_until(std::int64_t end_ns);
  std::int64_t idle_before(std::int64_t t) const;
};

}  // namespace tspemu
