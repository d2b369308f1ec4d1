// ComputeSpan: how a kernel reports its compute (a name and a FLOP count) to whatever observes the
// calling thread, without the kernel or the observer knowing each other.
//
// What: the layer below both `runtime/` and `reference/`. The reference's GEMM and attention
// kernels open a ComputeSpan around their work; a rank thread of a World with tracing or a
// simulated clock installs its ComputeObserver for the duration of the run, so any schedule —
// one of tspemu's or a user's — shows its compute in the trace and is charged on the simulated
// clock without asking. Outside a traced rank no observer is installed and a span costs one
// thread-local load and a null test.
// The thread's compute counter (current_compute_counter) is the other thing a span touches: it
// tells other threads that this one began a kernel (a rank's peers may then copy into its exposed
// buffers: runtime/transport/early_exposure.hpp).
// Requirements: the observer pointer is per thread; only the thread itself installs and uses it
// (ScopedComputeObserver). The observer must outlive the spans opened while it is installed.
// Guarantees: spans nest (a GEMM inside an attention kernel inside a user's "core" span); an
// observer sees each end with the token its begin returned. The FLOP count is given at the end
// (set_flops), so a kernel may count what it actually multiplied.
// Cost: tracing off, two thread-local loads per span and, on a rank's thread, one store.
#pragma once

#include <atomic>
#include <cstdint>

namespace tspemu {

class ComputeObserver {
 public:
  // What begin hands back to end: the span's start on the observer's clocks.
  struct Token {
    std::int64_t begin_ns = 0;
    std::int64_t sim_begin_ns = -1;
  };
  virtual Token begin_compute() noexcept = 0;
  virtual void end_compute(const Token& token, const char* name, double flops) noexcept = 0;

 protected:
  ~ComputeObserver() = default;
};

// The calling thread's observer (null: nobody is watching).
inline ComputeObserver*& current_compute_observer() noexcept {
  thread_local ComputeObserver* observer = nullptr;
  return observer;
}

// Installs an observer on the calling thread for its lifetime; restores the previous one after.
class ScopedComputeObserver {
 public:
  explicit ScopedComputeObserver(ComputeObserver* observer) noexcept
      : previous_(current_compute_observer()) {
    current_compute_observer() = observer;
  }
  ~ScopedComputeObserver() { current_compute_observer() = previous_; }
  ScopedComputeObserver(const ScopedComputeObserver&) = delete;
  ScopedComputeObserver& operator=(const ScopedComputeObserver&) = delete;

 private:
  ComputeObserver* previous_;
};

// The calling thread's compute counter (null: none). Every ComputeSpan raises it by one at its
// begin with a release store; a thread that loads it with acquire and finds it above a value read
// before knows the owner began a kernel since, and sees everything the owner did before that
// kernel. Only the owning thread installs and raises it (ScopedComputeCounter).
inline std::atomic<std::uint64_t>*& current_compute_counter() noexcept {
  thread_local std::atomic<std::uint64_t>* counter = nullptr;
  return counter;
}

// Installs a compute counter on the calling thread for its lifetime; restores the previous one.
class ScopedComputeCounter {
 public:
  explicit ScopedComputeCounter(std::atomic<std::uint64_t>* counter) noexcept
      : previous_(current_compute_counter()) {
    current_compute_counter() = counter;
  }
  ~ScopedComputeCounter() { current_compute_counter() = previous_; }
  ScopedComputeCounter(const ScopedComputeCounter&) = delete;
  ScopedComputeCounter& operator=(const ScopedComputeCounter&) = delete;

 private:
  std::atomic<std::uint64_t>* previous_;
};

// RAII span of compute on the calling thread. `name` must outlive the trace (a string literal).
class ComputeSpan {
 public:
  explicit ComputeSpan(const char* name, double flops = 0) noexcept
      : observer_(current_compute_observer()), name_(name), flops_(flops) {
    if (std::atomic<std::uint64_t>* counter = current_compute_counter())
      // relaxed load: only this thread writes it. release store: pairs with the acquire load of a
      // thread deciding whether this one began computing (see current_compute_counter).
      counter->store(counter->load(std::memory_order_relaxed) + 1, std::memory_order_release);
    if (observer_ != nullptr) token_ = observer_->begin_compute();
  }
  ~ComputeSpan() {
    if (observer_ != nullptr) observer_->end_compute(token_, name_, flops_);
  }
  ComputeSpan(const ComputeSpan&) = delete;
  ComputeSpan& operator=(const ComputeSpan&) = delete;

  bool observed() const noexcept { return observer_ != nullptr; }
  void set_flops(double flops) noexcept { flops_ = flops; }

 private:
  ComputeObserver* observer_;
  const char* name_;
  double flops_;
  ComputeObserver::Token token_{};
};

}  // namespace tspemu
