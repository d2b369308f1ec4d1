#include "watchdog.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <sstream>

#include "tspemu/runtime/error.hpp"
#include "wait.hpp"

namespace tspemu::detail {

void PendingSlot::publish(const OpRef& op, int waits_for_rank, std::int64_t since) {
  const std::uint64_t v = version.load(std::memory_order_relaxed);  // only this rank writes it
  // relaxed: the release stores of the fields below keep this store before them.
  version.store(v + 1, std::memory_order_relaxed);
  what.store(op.what, std::memory_order_release);
  stage.store(op.stage, std::memory_order_release);
  group.store(op.group, std::memory_order_release);
  seq.store(op.seq, std::memory_order_release);
  bytes.store(op.bytes, std::memory_order_release);
  peer_group_rank.store(op.peer_group_rank, std::memory_order_release);
  waits_for.store(waits_for_rank, std::memory_order_release);
  since_ns.store(since, std::memory_order_release);
  // release: a reader that sees v + 2 sees every field above (pairs with its acquire load).
  version.store(v + 2, std::memory_order_release);
}

void PendingSlot::clear() {
  const std::uint64_t v = version.load(std::memory_order_relaxed);
  version.store(v + 1, std::memory_order_relaxed);
  what.store(nullptr, std::memory_order_release);
  // release: pairs with the reader's acquire load of version, as in publish.
  version.store(v + 2, std::memory_order_release);
}

PendingOp read_pending(const PendingSlot& s) {
  PendingOp p;
  for (;;) {
    // acquire: pairs with the writer's final release store; the fields it wrote are visible.
    const std::uint64_t v = s.version.load(std::memory_order_acquire);
    if (v % 2 == 0) {
      // acquire loads: the re-read of version below cannot move above them.
      const char* what = s.what.load(std::memory_order_acquire);
      p.op.stage = s.stage.load(std::memory_order_acquire);
      p.op.group = s.group.load(std::memory_order_acquire);
      p.op.seq = s.seq.load(std::memory_order_acquire);
      p.op.bytes = s.bytes.load(std::memory_order_acquire);
      p.op.peer_group_rank = s.peer_group_rank.load(std::memory_order_acquire);
      p.waits_for = s.waits_for.load(std::memory_order_acquire);
      p.since_ns = s.since_ns.load(std::memory_order_acquire);
      // relaxed: ordered after the acquire loads above; equal means no write overlapped them.
      if (s.version.load(std::memory_order_relaxed) == v) {
        p.wait_id = v / 2;
        p.waiting = what != nullptr;
        p.op.what = what != nullptr ? what : "";
        return p;
      }
    }
    std::this_thread::yield();  // a write is in progress: a few stores, done at once
  }
}

namespace {

// Publishes each wait that outlasts its spin phase in the rank's PendingSlot, for the scans.
class PendingWaitObserver final : public Observer {
 public:
  // Always: hang errors and the watchdog both read the pending waits; waits past the spin phase
  // are the slow path.
  unsigned hooks(const WorldOptions&) const override { return kHookWait; }
  void on_wait_begin(RankState& self, const OpRef& op, int waits_for) override {
    self.pending.publish(op, waits_for, self.world->now_ns());
  }
  void on_wait_end(RankState& self) override { self.pending.clear(); }
};

}  // namespace

std::unique_ptr<Observer> make_pending_wait_observer() {
  return std::make_unique<PendingWaitObserver>();
}

namespace {

std::string seconds(std::int64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f s", static_cast<double>(ns) * 1e-9);
  return b;
}

bool is_world(const Group* g) {
  return g == nullptr || g->id == 0;
}

bool point_to_point(const OpRef& op) {
  return op.peer_group_rank >= 0;
}

// "all_gather #17 on group world" / "recv #3 from rank 2" / "send #1 to rank 0 on group row".
std::string op_name(const PendingOp& p) {
  std::string s = std::string(p.op.what) + " #" + std::to_string(p.op.seq);
  if (point_to_point(p.op)) {
    s += std::string(std::string_view(p.op.what) == "recv" ? " from" : " to") + " rank " +
         std::to_string(p.waits_for);
    if (!is_world(p.op.group)) s += " on group " + p.op.group->name;
  } else if (p.op.group != nullptr) {
    s += " on group " + p.op.group->name;
  }
  return s;
}

bool stage_is(const PendingOp& p, const char* stage) {
  return p.op.stage != nullptr && std::string_view(p.op.stage) == stage;
}

// Why rank `me` waits on p.waits_for, as a clause of the wait-for cycle.
std::string edge(int me, const PendingOp& p) {
  const std::string r = "rank " + std::to_string(p.waits_for);
  std::string s = "rank " + std::to_string(me) + " waits in " + op_name(p);
  if (point_to_point(p.op)) {
    if (std::string_view(p.op.what) == "send")
      s += stage_is(p, "a free mailbox slot")
               ? ", whose mailbox from rank " + std::to_string(me) + " is full"
               : ", which " + r + " has not received";
  } else if (stage_is(p, "every member to enter")) {
    s += ", which " + r + " never entered";
  } else if (stage_is(p, "reduced chunks")) {
    s += ", for the reduced chunk of " + r;
  } else {
    s += ", for " + r + " to finish it";
  }
  return s;
}

}  // namespace

std::string describe_pending(WorldShared& w, std::int64_t now_ns) {
  std::ostringstream m;
  m << "pending operations:";
  for (std::size_t i = 0; i < w.ranks.size(); ++i) {
    RankState& r = *w.ranks[i];
    m << "\n  rank " << i << ": ";
    if (!w.hosts(static_cast<int>(i))) {
      m << "in process " << w.process_of(static_cast<int>(i));
      continue;
    }
    // acquire: pairs with the release store of exited in the worker loop.
    if (r.exited.load(std::memory_order_acquire)) {
      m << "returned from its run function";
      continue;
    }
    const PendingOp p = read_pending(r.pending);
    if (!p.waiting) {
      m << "running (in no wait)";
      continue;
    }
    m << op_name(p);
    if (p.op.bytes > 0) m << ", " << format_bytes(p.op.bytes);
    m << ", waiting " << seconds(now_ns - p.since_ns) << " for ";
    if (point_to_point(p.op))
      m << p.op.stage;
    else if (stage_is(p, "every member to enter"))
      m << "rank " << p.waits_for << " to enter";
    else if (stage_is(p, "reduced chunks"))
      m << "the reduced chunk of rank " << p.waits_for;
    else
      m << "rank " << p.waits_for << " to finish";
  }
  return m.str();
}

std::string describe_wait_cycle(WorldShared& w) {
  const int n = static_cast<int>(w.ranks.size());
  std::vector<PendingOp> ops(static_cast<std::size_t>(n));
  std::vector<int> next(static_cast<std::size_t>(n), -1);
  for (int i = 0; i < n; ++i) {
    RankState& r = *w.ranks[static_cast<std::size_t>(i)];
    if (r.exited.load(std::memory_order_acquire)) continue;  // acquire: as in describe_pending
    ops[static_cast<std::size_t>(i)] = read_pending(r.pending);
    if (ops[static_cast<std::size_t>(i)].waiting)
      next[static_cast<std::size_t>(i)] = ops[static_cast<std::size_t>(i)].waits_for;
  }
  // Out-degree one: walk from each rank; a walk that returns to a rank of its own path closed a
  // cycle. Report the first cycle found from the lowest rank, starting at its lowest member.
  for (int start = 0; start < n; ++start) {
    std::vector<int> order(static_cast<std::size_t>(n), -1);  // position on this walk
    int r = start;
    for (int step = 0; r >= 0 && r < n && order[static_cast<std::size_t>(r)] < 0; ++step) {
      order[static_cast<std::size_t>(r)] = step;
      r = next[static_cast<std::size_t>(r)];
    }
    if (r < 0 || r >= n) continue;
    int lowest = r;
    for (int q = next[static_cast<std::size_t>(r)]; q != r; q = next[static_cast<std::size_t>(q)])
      lowest = std::min(lowest, q);
    std::string s = "wait-for cycle: ";
    int q = lowest;
    do {
      if (q != lowest) s += "; ";
      s += edge(q, ops[static_cast<std::size_t>(q)]);
      q = next[static_cast<std::size_t>(q)];
    } while (q != lowest);
    return s;
  }
  return "";
}

bool stuck_rank_poll(RankState& self, int peer, StuckWatch& watch,
                     std::chrono::nanoseconds waited) {
  WorldShared& w = *self.world;
  // Another process's rank: its progress is not visible here (see watchdog.hpp). Not in a world
  // spanning processes at all: a run returning without a rank would end the run in this process
  // only.
  if (w.link != nullptr || peer == self.rank || !w.hosts(peer)) return false;
  RankState& r = *w.ranks[static_cast<std::size_t>(peer)];
  // relaxed: RankState::ops_begun says why.
  const std::uint64_t ops = r.ops_begun.load(std::memory_order_relaxed);
  if (watch.rank != peer) watch = {peer, ops, std::chrono::nanoseconds(0)};  // the first look
  if (read_pending(r.pending).waiting || ops != watch.ops) {
    watch.ops = ops;  // it is in the runtime, or was since the last look: watch anew
    watch.since = waited;
    return false;
  }
  const std::chrono::nanoseconds outside = waited - watch.since;
  if (outside < w.opts.stuck_rank_timeout) return false;
  const std::int64_t now = w.now_ns();
  std::ostringstream m;
  m << "rank " << peer << " has not entered a collective for " << seconds(outside.count())
    << " (stuck_rank_timeout "
    << seconds(std::chrono::nanoseconds(w.opts.stuck_rank_timeout).count()) << ")";
  for (std::size_t i = 0; i < w.ranks.size(); ++i) {
    RankState& q = *w.ranks[i];
    // acquire: as in describe_pending.
    if (!w.hosts(static_cast<int>(i)) || q.exited.load(std::memory_order_acquire)) continue;
    const PendingOp p = read_pending(q.pending);
    if (p.waiting && p.waits_for == peer) m << "; rank " << i << " waits in " << op_name(p);
  }
  m << "\n" << describe_pending(w, now);
  // Counted before the CAS, so the stuck rank's decrement (after it loses its own CAS, which
  // follows this one) never takes `stranded` below zero; relaxed: the CAS's release publishes it.
  w.stranded.fetch_add(1, std::memory_order_relaxed);
  int expected = RankState::kInRun;
  // acq_rel: see RankState::departure.
  if (!r.departure.compare_exchange_strong(expected, RankState::kGivenUp, std::memory_order_acq_rel,
                                           std::memory_order_acquire)) {
    // It has just returned, or another waiter gave it up first: nothing to report here.
    // acq_rel: as the stuck rank's own decrement (run_rank).
    if (w.stranded.fetch_sub(1, std::memory_order_acq_rel) == 1) w.stranded.notify_all();
    return false;
  }
  const HangError error(m.str());
  report_hang_now(error.what());
  w.fail(peer, error.what(), std::make_exception_ptr(error));
  // The stuck rank's share of World::run's count, which its worker will not give back (run_rank);
  // acq_rel: as every worker's decrement (World::run's acquire load pairs with it).
  if (w.running.fetch_sub(1, std::memory_order_acq_rel) == 1) w.running.notify_all();
  return true;
}

void watchdog_poll(RankState& self) {
  WorldShared& w = *self.world;
  const std::int64_t now = w.now_ns();
  const std::int64_t quiet = std::chrono::nanoseconds(w.opts.watchdog_timeout).count();
  bool stuck = true;
  bool same_as_last = self.scan_valid;
  std::int64_t newest = 0;
  for (std::size_t i = 0; i < w.ranks.size(); ++i) {
    RankState& r = *w.ranks[i];
    std::uint64_t id = ~std::uint64_t{0};  // a returned rank: never changes
    // acquire: pairs with the release store of exited; a returned rank stays returned.
    if (!r.exited.load(std::memory_order_acquire)) {
      const PendingOp p = read_pending(r.pending);
      if (!p.waiting || now - p.since_ns < quiet) {
        stuck = false;
        break;
      }
      newest = std::max(newest, p.since_ns);
      id = p.wait_id;
    }
    same_as_last = same_as_last && self.last_scan[i] == id;
    self.last_scan[i] = id;
  }
  self.scan_valid = stuck;
  if (!stuck || !same_as_last) return;
  std::ostringstream m;
  m << "hang: no rank made progress for " << seconds(now - newest) << " (watchdog_timeout "
    << seconds(quiet) << "); every rank is blocked or has returned\n"
    << describe_pending(w, now);
  const std::string cycle = describe_wait_cycle(w);
  m << "\n" << (cycle.empty() ? "no wait-for cycle" : cycle);
  report_hang_now(m.str());
  raise(self, HangError(m.str()));
}

}  // namespace tspemu::detail
