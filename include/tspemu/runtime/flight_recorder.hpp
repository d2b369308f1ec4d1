// FlightRecorder: the last N communication operations of one rank, always on.
//
// What: a fixed ring of OpRecords (collective calls, sends, receives: kind, sequence number,
// group, peer or root, bytes, begin and end time, outcome). World keeps one per rank and prints
// them with any failure of a run (RankFailure::flight_record()), so the error shows what each rank
// did last, not only where it stopped.
// Requirements: written only by the thread of the rank that owns it; read only while that rank is
// not running (World::run reads it after every rank has stopped, which the run's completion
// counter publishes), so it needs no atomics and no locks.
// Guarantees: no allocation after construction; begin/end cost a clock read (raw ticks, scaled
// only when read) and a few stores; an end the caller marks as taking no time (an operation that
// neither waited nor moved more than a few KiB: see notify_end in runtime/world/op_hooks.hpp) reads
// no clock and records the begin time as its end, so it prints "took 0.000 ms". The ring is cleared
// at the start of each run: records name groups that live for one run. Cost: O(1) per operation;
// memory N x 64 B (64 records: 4 KiB) per rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tspemu/runtime/elapsed_clock.hpp"

namespace tspemu {

struct OpRecord {
  enum class Outcome : std::uint8_t { running, done, failed };
  const char* what = "";               // "all_gather", "send", "recv", ...
  std::uint64_t seq = 0;               // collective number on the group, or message number
  const std::string* group = nullptr;  // group name (lives until the next run starts)
  int peer = -1;                       // world rank of the peer (send/recv), else -1
  int root = -1;                       // group rank of the root (broadcast/reduce), else -1
  std::uint64_t bytes = 0;             // the call's payload: count x element size
  std::int64_t begin_ns = 0;           // since the world was made
  std::int64_t end_ns = 0;
  Outcome outcome = Outcome::running;
};

class FlightRecorder {
 public:
  // `clock` (the world's) stamps the records; it must outlive the recorder.
  FlightRecorder(std::size_t depth, const ElapsedClock& clock) : ring_(depth), clock_(&clock) {}

  // Records the start of an operation now; returns its id for end().
  std::uint64_t begin(const char* what, std::uint64_t seq, const std::string* group, int peer,
                      int root, std::uint64_t bytes) {
    if (ring_.empty()) return 0;
    Entry& slot = ring_[next_slot_];
    slot.what = what;
    slot.seq = seq;
    slot.group = group;
    slot.peer = peer;
    slot.root = root;
    slot.bytes = bytes;
    // Raw clock ticks, scaled only when a record is read (last(), format()): this runs on every
    // operation, the reads happen after a failure. end_ticks is valid once outcome is not running.
    slot.begin_ticks = clock_->ticks();
    slot.outcome = OpRecord::Outcome::running;
    next_slot_ = next_slot_ + 1 == ring_.size() ? 0 : next_slot_ + 1;
    return next_++;
  }
  // Records the end of operation `id` now, or at its begin time when the caller knows it
  // took no measurable time (`took_no_time`: no clock read), unless it has already left the ring.
  void end(std::uint64_t id, bool ok, bool took_no_time = false) {
    const std::uint64_t back = next_ - id;           // 1 for the newest record
    if (id >= next_ || back > ring_.size()) return;  // also an empty ring: next_ stays 0
    Entry& slot = ring_[next_slot_ >= back ? next_slot_ - back : next_slot_ + ring_.size() - back];
    slot.end_ticks = took_no_time ? slot.begin_ticks : clock_->ticks();
    slot.outcome = ok ? OpRecord::Outcome::done : OpRecord::Outcome::failed;
  }
  void clear() { next_ = next_slot_ = 0; }

  std::size_t depth() const { return ring_.size(); }
  std::uint64_t total() const { return next_; }  // operations recorded since clear()
  // The last min(limit, depth) records, oldest first.
  std::vector<OpRecord> last(std::size_t limit) const;
  // One line per record, oldest first, indented: "  #12 all_gather #3 on group world, 4.00 KiB,
  // 0.153 ms at 12.345 ms: done". `now_ns` (the clock's now_ns()) dates the running ones.
  std::string format(std::size_t limit, std::int64_t now_ns) const;

 private:
  // An OpRecord with its times as clock ticks (ElapsedClock::ticks).
  struct Entry {
    const char* what;
    std::uint64_t seq;
    const std::string* group;
    int peer;
    int root;
    std::uint64_t bytes;
    std::uint64_t begin_ticks;
    std::uint64_t end_ticks;
    OpRecord::Outcome outcome;
  };
  OpRecord record(const Entry& e) const;

  std::vector<Entry> ring_;
  const ElapsedClock* clock_;
  std::uint64_t next_ = 0;
  // next_ % depth, kept beside it: begin and end run on every operation, and a 64-bit division
  // costs more than the rest of them.
  std::size_t next_slot_ = 0;
};

std::string describe(const OpRecord& r);

}  // namespace tspemu
