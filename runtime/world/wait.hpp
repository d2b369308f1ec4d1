// The one wait loop of the runtime (spin, yield, then park, polling the abort flag, a peer's
// departure and the hang timeout) and the runtime failures it raises.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "../transport/op_ref.hpp"
#include "../transport/parker.hpp"
#include "watchdog.hpp"
#include "world_state.hpp"

namespace tspemu::detail {

// Tells the observers a wait outlasted its spin phase, and when it ends.
class WaitScope {
 public:
  WaitScope(RankState& self, const OpRef& op, int waits_for);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  RankState& self_;
};

// Waits until ready() holds: spins, yields, then parks, polling the abort flag, the departure of
// `peer` (a world rank, or -1) and the hang timeout. `op` describes the wait for error messages.
// Throws PeerFailure or HangError (after raising the world's abort).
template <class Ready>
void wait_until(RankState& self, int peer, const OpRef& op, Ready&& ready);

// Throws PeerFailure naming the first failure if the world is aborting.
void check_abort(RankState& self, const OpRef& op);
// Raises a runtime failure detected by this rank: records it, aborts the world, throws it.
template <class E>
[[noreturn]] void raise(RankState& self, const E& error) {
  self.world->fail(self.rank, error.what(), std::make_exception_ptr(error));
  throw error;
}

[[noreturn]] void throw_departed(RankState& self, int peer, const OpRef& op);
// Prints a hang diagnosis to stderr at once: a rank busy outside the runtime may keep World::run
// from returning (and so the error from its caller) for as long as it computes.
void report_hang_now(const std::string& diagnosis);
[[noreturn]] void throw_hang(RankState& self, int peer, const OpRef& op,
                             std::chrono::steady_clock::duration waited);

// Longest time wait_until spends yielding before it parks (and starts polling the abort flag).
inline constexpr std::chrono::microseconds kMaxYieldPhase{20000};

template <class Ready>
void wait_until(RankState& self, int peer, const OpRef& op, Ready&& ready) {
  if (ready()) return;
  ++self.waits;
  WorldShared& w = *self.world;
  for (int i = 0; i < w.spin_iterations; ++i) {
    cpu_relax();
    if (ready()) return;
  }
  auto start = std::chrono::steady_clock::now();
  auto before = start;
  // From here on the wait is visible to the observers (the watchdog's scans of pending waits).
  WaitScope pending(self, op, peer);
  StuckWatch watch;
  const bool watch_peer = peer >= 0 && w.opts.stuck_rank_timeout.count() > 0;
  for (int i = 0; i < w.yield_iterations; ++i) {
    std::this_thread::yield();
    if (ready()) return;
    // A yield can give the core away for a whole time slice when other threads want it: park
    // instead once that happens (long_yield), and bound the phase in time so the abort flag
    // (polled below) is seen well within the 100 ms abort bound.
    const auto after = std::chrono::steady_clock::now();
    if (after - before > w.long_yield || after - start > kMaxYieldPhase) break;
    before = after;
  }
  for (;;) {
    self.parker.prepare();
    if (ready()) {
      self.parker.cancel();
      return;
    }
    check_abort(self, op);
    // acquire: pairs with the release store in the departing rank's worker loop; everything it
    // published before leaving is visible, so the recheck below is final.
    if (peer >= 0 &&
        w.ranks[static_cast<std::size_t>(peer)]->exited.load(std::memory_order_acquire)) {
      self.parker.cancel();
      if (ready()) return;
      throw_departed(self, peer, op);
    }
    auto waited = std::chrono::steady_clock::now() - start;
    // Before hang_timeout: with equal bounds the stuck rank, not the waiter, is named.
    if (watch_peer && stuck_rank_poll(self, peer, watch, waited)) {
      self.parker.cancel();
      check_abort(self, op);  // the run has failed: throws PeerFailure naming the stuck rank
    }
    if (waited >= w.opts.hang_timeout) {
      self.parker.cancel();
      throw_hang(self, peer, op, waited);
    }
    if (w.opts.watchdog_timeout.count() > 0 && waited >= w.opts.watchdog_timeout)
      watchdog_poll(self);
    auto left = w.opts.hang_timeout - waited;
    self.parker.park(std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(20)));
  }
}

}  // namespace tspemu::detail
