// Deferred termination signals: a scope whose cleanup must run even when the user interrupts it
// (a checkpoint save must not leave temporaries or half a checkpoint behind).
//
// What: while a SignalDeferral is alive, SIGINT and SIGTERM only record themselves (the first
// one); pending_signal() returns it, so long work inside the scope checks it at safe points and
// throws (write_all in atomic_file.hpp does, between chunks). When the outermost SignalDeferral
// is destroyed — after the destructors and catch blocks of everything inside it have cleaned up —
// the previous dispositions are restored and a recorded signal is raised again, so the process
// ends as the signal would have ended it (status 128 + signal number in a shell).
// Requirements: scopes nest on one thread at a time (the save runs on the main thread); a
// previous disposition that is a handler gets the signal as it would have, only later.
// Guarantees: the handler only stores to a lock-free atomic (async-signal-safe); a signal that
// arrives outside every scope keeps the process's own disposition, and an ignored signal stays
// ignored inside one.
// Cost: two sigaction calls per signal on entering and on leaving the outermost scope.
#pragma once

#include <signal.h>

#include <array>
#include <atomic>
#include <mutex>

namespace tspemu {

namespace detail {

// The signal recorded inside the scope, 0 if none. Relaxed everywhere: the flag publishes no other
// data; the thread that acts on it only needs to see the value eventually (it polls), and the
// handler may run on any thread.
inline std::atomic<int> g_deferred_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler stores to it");

inline constexpr std::array<int, 2> kDeferredSignals{SIGINT, SIGTERM};

extern "C" inline void record_deferred_signal(int sig) {
  int none = 0;
  g_deferred_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
}

struct DeferralState {
  std::mutex mutex;
  int depth = 0;
  std::array<struct sigaction, kDeferredSignals.size()> previous{};
};

inline DeferralState& deferral_state() {
  static DeferralState s;
  return s;
}

}  // namespace detail

// The SIGINT or SIGTERM received inside the current scope, 0 if none.
inline int pending_signal() {
  return detail::g_deferred_signal.load(std::memory_order_relaxed);
}

class SignalDeferral {
 public:
  SignalDeferral() {
    detail::DeferralState& s = detail::deferral_state();
    const std::lock_guard lock(s.mutex);
    if (s.depth++ > 0) return;
    struct sigaction sa {};
    sa.sa_handler = detail::record_deferred_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a write interrupted by it resumes; the loop then sees the flag
    for (std::size_t i = 0; i < detail::kDeferredSignals.size(); ++i) {
      ::sigaction(detail::kDeferredSignals[i], nullptr, &s.previous[i]);
      // An ignored signal stays ignored (a shell's background job ignores SIGINT).
      if (s.previous[i].sa_handler != SIG_IGN)
        ::sigaction(detail::kDeferredSignals[i], &sa, nullptr);
    }
  }
  ~SignalDeferral() {
    detail::DeferralState& s = detail::deferral_state();
    const std::lock_guard lock(s.mutex);
    if (--s.depth > 0) return;
    for (std::size_t i = 0; i < detail::kDeferredSignals.size(); ++i)
      ::sigaction(detail::kDeferredSignals[i], &s.previous[i], nullptr);
    const int sig = detail::g_deferred_signal.exchange(0, std::memory_order_relaxed);
    if (sig != 0) ::raise(sig);  // the previous disposition acts now, the cleanup done
  }
  SignalDeferral(const SignalDeferral&) = delete;
  SignalDeferral& operator=(const SignalDeferral&) = delete;
};

}  // namespace tspemu
