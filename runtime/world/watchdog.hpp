// Hang watchdog: per-rank publication of the pending wait, and the diagnosis of a stuck world.
//
// Every wait that outlasts its spin phase publishes what it waits for (operation, sequence
// number, group, peer, bytes, the world rank it waits on, since when) in its rank's PendingSlot;
// the slot is cleared when the wait ends. A waiting rank polls the world every park interval
// (20 ms): when every rank is blocked in a published wait or has returned from its run function,
// none of those waits began within WorldOptions::watchdog_timeout, and a second scan one interval
// later finds exactly the same waits (same wait ids), no rank can make progress any more, so the
// rank raises HangError with the diagnosis: each rank's pending operation and the wait-for cycle.
// Every wait has exactly one rank it waits on, so the wait-for graph has out-degree one and a
// cycle is found by walking it.
//
// The two scans make a false alarm need a wait that has been satisfiable (its peer posted) for a
// whole watchdog_timeout without its rank noticing; waiters park for at most 20 ms, so that would
// take a rank starved of CPU for that long. A rank busy outside the runtime (computing, or looping
// forever) is not blocked: the watchdog stays quiet.
//
// Stuck rank: a rank outside the runtime is reported by the ranks waiting for it instead. Each
// waiter, at every wake-up of its parked phase, looks at the rank it waits for: when that rank has
// been in no wait and has begun no operation (RankState::ops_begun unchanged) for
// WorldOptions::stuck_rank_timeout, the waiter gives it up (RankState::departure), fails the run
// with HangError in the stuck rank's name ("rank 1 has not entered a collective for 30.00 s ...;
// rank 0 waits in all_reduce #3 on group world" and every rank's pending operation) and counts it
// out of World::run's wait, so run() returns although the stuck rank cannot be interrupted. A
// rank of another process (MPI) is not watched: its progress is not visible here, and the
// per-wait hang_timeout reports the wait. A deadlock (every rank blocked) is the watchdog's.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "../transport/op_ref.hpp"

namespace tspemu::detail {

struct Group;
struct RankState;
struct WorldShared;

std::string describe(const OpRef& op);

// What one rank is blocked on, published for the other ranks' watchdog scans. Written only by
// its rank; read by any rank. A seqlock over atomic fields: the writer makes `version` odd, stores
// the fields, makes it even again; a reader retries until it sees the same even version before
// and after. All fields are atomics, so a torn read is retried, never a data race.
struct alignas(64) PendingSlot {
  // relaxed store of the odd value, then release stores of the fields (so the odd value is
  // ordered before them), then a release store of the even value (orders the fields before it).
  // Readers: acquire load of version, acquire loads of the fields (keep the re-read of version
  // after them), then a relaxed re-load of version. version / 2 is the wait id.
  std::atomic<std::uint64_t> version{0};
  std::atomic<const char*> what{nullptr};  // null: not waiting
  std::atomic<const char*> stage{nullptr};
  std::atomic<const Group*> group{nullptr};
  std::atomic<std::uint64_t> seq{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<int> peer_group_rank{-1};
  std::atomic<int> waits_for{-1};  // world rank this wait depends on, -1 if none
  std::atomic<std::int64_t> since_ns{0};

  void publish(const OpRef& op, int waits_for_rank, std::int64_t since);
  void clear();
};

// A consistent copy of a PendingSlot.
struct PendingOp {
  std::uint64_t wait_id = 0;
  bool waiting = false;
  OpRef op;
  int waits_for = -1;
  std::int64_t since_ns = 0;
};
PendingOp read_pending(const PendingSlot& slot);

// What a waiter knows of the rank it waits for (stuck_rank_poll): that rank, its ops_begun when
// last seen changed or in a wait, and how far into the wait that was (0: it has been outside
// since the wait began). Timed on the wait's own clock, as hang_timeout is, so with equal bounds
// the stuck rank is named first.
struct StuckWatch {
  int rank = -1;
  std::uint64_t ops = 0;
  std::chrono::nanoseconds since{0};
};
// Called by a parked waiter on each wake-up (stuck_rank_timeout on), `waited` into its wait for
// world rank `peer`: when `peer` is stuck outside the runtime (see above), gives it up, fails the
// run with HangError in its name and returns true (the caller stops waiting); else false.
bool stuck_rank_poll(RankState& self, int peer, StuckWatch& watch, std::chrono::nanoseconds waited);

// Called by a parked waiter on each wake-up once its own wait is older than the watchdog timeout.
// Raises HangError with the diagnosis when the world is stuck (see above); otherwise returns.
void watchdog_poll(RankState& self);

// "pending operations:" then one line per rank: what it waits for, or that it is running or has
// returned. Used by every hang report.
std::string describe_pending(WorldShared& w, std::int64_t now_ns);
// The wait-for cycle through the published waits ("rank 3 waits in recv #1 from rank 2; rank 2
// waits in all_gather #1 on group world, which rank 3 never entered"), or "" when there is none.
std::string describe_wait_cycle(WorldShared& w);

}  // namespace tspemu::detail
