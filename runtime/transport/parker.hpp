// Parker: where a rank's thread sleeps when a wait has spun and yielded long enough.
//
// One Parker per rank. A waiter announces itself (prepare), re-checks its condition, then parks on
// a futex; a poster that changed a condition some rank may wait on (store_waited) then calls
// unpark(rank). The pair is a Dekker handshake: waiter {store sleeping=1; fence; load cond},
// poster {store cond; fence; load sleeping}, so at least one side sees the other's store — either
// the waiter sees the new condition, or the poster sees sleeping=1 and wakes it. No wakeup is lost.
// Spurious wakeups are harmless: waiters loop.
//
// The fences are asymmetric (the liburcu / folly "asymmetric Dekker" pattern) when the kernel
// offers membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), decided once per process
// (WakeFences): a poster posts on every call and a waiter parks only after spinning and
// yielding, so the poster's fence is only a compiler barrier and the waiter's is the heavy one.
// membarrier returns only after every other CPU running a thread of this process has executed a
// full memory barrier; a thread not running then passes one in the context switch. So the
// poster's {store cond; compiler barrier; load sleeping}, which the compiler keeps in that order,
// is split by a full barrier at some point, as if the poster had fenced: if that point lies
// between its store and its load, the store is visible before the waiter's load of cond, or, if it
// lies before the store, the waiter's store of sleeping=1 (before membarrier) is visible to the
// load. Without membarrier (ENOSYS, EPERM under seccomp, or TSPEMU_MEMBARRIER=0) the poster's
// store is seq_cst and the waiter's fence is its seq_cst store, the symmetric form.
//
// Only wake-ups ride on this handshake, never data: every waited-on condition is still published
// by a release store (at least) and read by an acquire (or stronger) load, which is what orders
// the data behind it. ThreadSanitizer does not model membarrier, but a handshake it cannot follow
// can at worst look like a lost wake-up to it, not hide a race: the release/acquire pairs it does
// model are the ones the data depends on. (And a lost wake-up would cost one park timeout, at
// most 20 ms in wait_until, not a hang.)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tspemu::detail {

// The handshake's form for this process: asymmetric (above) when membarrier's private expedited
// command is available and registered and TSPEMU_MEMBARRIER is not "0", symmetric otherwise.
class WakeFences {
 public:
  // Decides at the first call, which every Parker's constructor makes (so the first world's
  // construction decides), and returns the choice, the same for the whole process after.
  static bool decide();
  // The choice, as a plain load: read on every post. Only a thread that a decide() call happens
  // before reads it, so it sees the decision: a rank's thread starts after its world's Parkers
  // exist, and thread creation orders their decide() before it.
  static bool asymmetric() { return asymmetric_; }

 private:
  static bool asymmetric_;  // written once, by decide()'s first call
};

// The poster's store-and-fence half of the handshake: stores `value` into a condition that a
// waiter may park on; unpark() the waiters after it. Release (at least): the condition publishes
// whatever the waiter reads after it sees `value`.
template <class T>
inline void store_waited(std::atomic<T>& cond, T value) {
  if (WakeFences::asymmetric()) {
    cond.store(value, std::memory_order_release);
    // Keeps the compiler from moving unpark()'s load of `sleeping_` above the store; the
    // waiter's membarrier makes it a full barrier at run time (see above).
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    cond.store(value, std::memory_order_seq_cst);
  }
}

class Parker {
 public:
  Parker() { (void)WakeFences::decide(); }  // decides the fences before any rank posts
  // The waiter's store-and-fence half of the handshake (see above): seq_cst store, then, with
  // asymmetric fences, the heavy barrier before the caller re-checks its condition.
  void prepare() {
    sleeping_.store(1, std::memory_order_seq_cst);
    if (WakeFences::asymmetric()) heavy_fence();
  }
  // relaxed: only this thread's own later futex call depends on it.
  void cancel() { sleeping_.store(0, std::memory_order_relaxed); }
  // Sleeps until unpark() or `max` elapses (or spuriously).
  void park(std::chrono::nanoseconds max);
  void unpark() {
    // seq_cst: the load half of the poster's Dekker pair (after store_waited or another seq_cst
    // store); pairs with prepare().
    if (sleeping_.load(std::memory_order_seq_cst) != 0) {
      sleeping_.store(0, std::memory_order_seq_cst);
      wake();
    }
  }

 private:
  static void heavy_fence();
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
