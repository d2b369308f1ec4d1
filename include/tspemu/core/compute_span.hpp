// ComputeSpan: how a kernel reports its compute (a name and a FLOP count) to whatever observes the
// calling thread, without the kernel or the observer knowing each other.
//
// What: the layer below both `runtime/` and `reference/`. The reference's GEMM and attention
// kernels open a ComputeSpan around their work; a rank thread of a World with tracing or a
// simulated clock installs its ComputeObserver for the duration of the run, so any schedule —
// one of tspemu's or a user's — shows its compute in the trace and is charged on the simulated
// clock without asking. Outside a traced rank no observer is installed and a span costs one
// thread-local load and a null test.
// Requirements: the observer pointer is per thread; only the thread itself installs and uses it
// (ScopedComputeObserver). The observer must outlive the spans opened while it is installed.
// Guarantees: spans nest (a GEMM inside an attention kernel inside a user's "core" span); an
// observer sees each end with the token its begin returned. The FLOP count is given at the end
// (set_flops), so a kernel may count what it actually multiplied.
// Cost: tracing off, one thread-local load per span.
#pragma once

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

// RAII span of compute on the calling thread. `name` must outlive the trace (a string literal).
class ComputeSpan {
 public:
  explicit ComputeSpan(const char* name, double flops = 0) noexcept
      : observer_(current_compute_observer()), name_(name), flops_(flops) {
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
