// ElapsedClock: nanoseconds since an origin, cheap enough to read at the begin and end of every
// collective call (the time base of a world's flight records, pending waits and trace events).
//
// What: on x86-64 with an invariant TSC that the kernel itself keeps time with (clocksource
// "tsc", which it chooses only after checking the TSC is synchronised across CPUs), now_ns()
// reads the TSC and scales it by a factor calibrated once per process against
// std::chrono::steady_clock; elsewhere, or with Source::steady, it reads steady_clock. rdtsc is
// several times cheaper than steady_clock::now() through the vDSO (docs/benchmarks.md).
// Requirements: none; copies share the origin.
// Guarantees: non-decreasing per thread (an invariant, synchronised TSC as the kernel checked it,
// or steady_clock); readings of different threads compare to within the TSC synchronisation. The
// TSC scale is off by at most ~1e-4 (a 2 ms calibration window, each end bracketed by
// steady_clock reads), so ages of seconds are right to well under a millisecond; durations
// measured against steady_clock (the hang timeout) do not use this clock.
// Cost: TSC: one rdtsc, a subtraction and a multiply (ticks(): the rdtsc alone). The first TSC
// clock of a process calibrates (about 2 ms, once).
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace tspemu {

class ElapsedClock {
 public:
  enum class Source {
    best,   // the TSC when usable (see above), else steady_clock
    steady  // always steady_clock
  };
  explicit ElapsedClock(Source source = Source::best);

  std::int64_t now_ns() const { return ns_of(ticks()); }
  // The raw reading now_ns() scales: TSC ticks, or steady_clock nanoseconds since the origin. For
  // stamps taken on every operation and read rarely (the flight recorder): ns_of() converts later.
  std::uint64_t ticks() const {
#if defined(__x86_64__)
    if (ns_per_tick_ > 0) return __rdtsc();
#endif
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now() - origin_)
                                          .count());
  }
  // Nanoseconds since the origin of a ticks() reading of this clock (or a copy of it).
  std::int64_t ns_of(std::uint64_t ticks) const {
    // Signed difference: another CPU's TSC may be a few cycles behind the origin's.
    if (ns_per_tick_ > 0)
      return static_cast<std::int64_t>(
          static_cast<double>(static_cast<std::int64_t>(ticks - origin_ticks_)) * ns_per_tick_);
    return static_cast<std::int64_t>(ticks);
  }
  // Whether now_ns() reads the TSC.
  bool reads_tsc() const {
    return ns_per_tick_ > 0;
  }

 private:
  std::chrono::steady_clock::time_point origin_;
  std::uint64_t origin_ticks_ = 0;
  double ns_per_tick_ = 0;  // 0: steady_clock
};

}  // namespace tspemu
