// Dry run: whether the calling thread runs a schedule for its accounting only.
//
// What: the layer below `runtime/` and `reference/`. A World made with WorldOptions::dry_run sets
// the flag on every rank thread for the duration of a run; its arenas then hand out unbacked
// addresses (runtime/arena.hpp), so every kernel and copy the blocks run must skip its arithmetic
// and its bytes when dry_run() is true. Reference kernels test it without knowing of ranks. What a
// dry run measures is what the schedule allocates and communicates: per-rank memory by category
// and bytes per collective, at sizes that could not be run for real.
// Requirements: the flag is per thread; only the thread itself sets it (ScopedDryRun). A kernel
// that returns early in dry mode still opens its ComputeSpan with its FLOP count, so a simulated
// clock keeps counting compute.
// Guarantees: outside a dry World the flag is false and testing it costs one thread-local load.
// A kernel or copy that forgets the test touches dry memory and the process stops with a message
// naming the address (the arena's fault handler, exit code 3) instead of computing garbage.
#pragma once

namespace tspemu {

inline bool& dry_run_flag() noexcept {
  thread_local bool dry = false;
  return dry;
}

// True when the calling thread runs a schedule for its accounting only: skip arithmetic and copies.
inline bool dry_run() noexcept {
  return dry_run_flag();
}

// Sets the calling thread's flag for its lifetime; restores the previous value after.
class ScopedDryRun {
 public:
  explicit ScopedDryRun(bool dry) noexcept : previous_(dry_run_flag()) { dry_run_flag() = dry; }
  ~ScopedDryRun() { dry_run_flag() = previous_; }
  ScopedDryRun(const ScopedDryRun&) = delete;
  ScopedDryRun& operator=(const ScopedDryRun&) = delete;

 private:
  bool previous_;
};

}  // namespace tspemu
