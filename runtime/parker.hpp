// Parker: where a rank's thread sleeps when a wait has spun and yielded long enough.
//
// One Parker per rank. A waiter announces itself (prepare), re-checks its condition, then parks on
// a futex; a poster that changed a condition some rank may wait on calls unpark(rank) after its
// seq_cst store. The pair is the classic Dekker handshake: waiter {store sleeping=1; load cond},
// poster {store cond; load sleeping}, all seq_cst, so at least one side sees the other's store —
// either the waiter sees the new condition, or the poster sees sleeping=1 and wakes it. No wakeup
// is lost. Spurious wakeups are harmless: waiters loop.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tspemu::detail {

class Parker {
 public:
  // seq_cst: the store half of the waiter's Dekker pair (see above).
  void prepare() { sleeping_.store(1, std::memory_order_seq_cst); }
  // relaxed: only this thread's own later futex call depends on it.
  void cancel() { sleeping_.store(0, std::memory_order_relaxed); }
  // Sleeps until unpark() or `max` elapses (or spuriously).
  void park(std::chrono::nanoseconds max);
  void unpark() {
    // seq_cst: the load half of the poster's Dekker pair; pairs with prepare().
    if (sleeping_.load(std::memory_order_seq_cst) != 0) {
      sleeping_.store(0, std::memory_order_seq_cst);
      wake();
    }
  }

 private:
  void wake();
  alignas(64) std::atomic<std::uint32_t> sleeping_{0};
};

// Brief busy-wait step: the x86 pause instruction (a no-op elsewhere).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace tspemu::detail
