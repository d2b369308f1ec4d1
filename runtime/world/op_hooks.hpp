// The hooks around every operation of a rank: the observers selected for the run (observer.hpp)
// and the built-in flight recorder, at an operation's begin, meet and end; the simulated clock's
// model.
#pragma once

#include <cstdint>

#include "observer.hpp"
#include "world_state.hpp"

namespace tspemu::detail {

inline bool observed(const RankState& self, const OpInfo& op, ObserverHook hook) {
  return (self.world->observed[static_cast<int>(op.kind)] & hook) != 0;
}
// The flight recorder (flight_recorder.hpp) is built in: always on, so it is called directly
// rather than through the observer lists (an indirect call per hook and a list walk cost more
// than the record). A record opens at a collective, an isend or an irecv and closes at the
// operation that completes it: anything but an irecv's post, and a send's isend only when it was
// copied eagerly (else its wait or withdrawal closes it). It opens after the listed observers'
// begin, so an injected delay is not part of the recorded operation.
// The listed observers' hooks, out of line: a run with none of them selected never calls these,
// and keeping the walks out of notify_* lets those inline into every operation.
void run_begin_hooks(RankState& self, OpInfo& op);
void run_end_hooks(RankState& self, OpInfo& op, bool ok);

// Counts an operation this rank begins, for the stuck-rank watch of the ranks waiting for it
// (RankState::ops_begun; relaxed, as said there; only this rank writes it, so no RMW).
inline void note_entry(RankState& self) {
  self.ops_begun.store(self.ops_begun.load(std::memory_order_relaxed) + 1,
                       std::memory_order_relaxed);
}
inline void notify_begin(RankState& self, OpInfo& op) {
  note_entry(self);
  if (observed(self, op, kHookBegin)) run_begin_hooks(self, op);
  op.waits_at_begin = self.waits;
  if (op.kind == OpInfo::Kind::collective || op.kind == OpInfo::Kind::send ||
      op.kind == OpInfo::Kind::recv_post)
    op.record = self.flight.begin(op.what, op.seq, &op.group->name, op.peer, op.root, op.bytes);
}
inline void notify_meet(RankState& self, OpInfo& op, const MemberHeaders& headers) {
  if (!observed(self, op, kHookMeet)) return;
  for (Observer* o : self.world->on_meet) o->on_meet(self, op, headers);
}
// Closes the flight record of an operation that opened it itself (a collective, an eager send).
// One that succeeded without waiting, with at most kSmallMessageBytes per rank, ran only its own
// few hundred instructions and copies of at most a few KiB, well under the microsecond a record
// prints: it is recorded as taking no time, which saves a clock read (a noticeable share of such a
// call: docs/benchmarks.md). Only a preemption inside it goes unseen. Every other end reads the
// clock (a receive's or a send's wait closes a record opened earlier, at irecv or isend).
inline void end_own_record(RankState& self, std::uint64_t record, bool ok, std::uint64_t bytes,
                           std::uint64_t waits_at_begin) {
  self.flight.end(
      record, ok,
      /*took_no_time=*/ok && bytes <= kSmallMessageBytes && self.waits == waits_at_begin);
}
inline void notify_end(RankState& self, OpInfo& op, bool ok) {
  if (op.kind == OpInfo::Kind::collective || (op.kind == OpInfo::Kind::send && op.completes_record))
    end_own_record(self, op.record, ok, op.bytes, op.waits_at_begin);
  else if (op.kind != OpInfo::Kind::recv_post && op.kind != OpInfo::Kind::send)
    self.flight.end(op.record, ok);
  if (observed(self, op, kHookEnd)) run_end_hooks(self, op, ok);
}

// The simulated-clock model of the world, or null (sim_clock.hpp).
inline const SimClockModel* sim_model(const RankState& self) {
  return self.world->opts.sim_clock ? &*self.world->opts.sim_clock : nullptr;
}
inline std::int64_t sim_ns_of(double seconds) {
  return static_cast<std::int64_t>(seconds * 1e9);
}

}  // namespace tspemu::detail
