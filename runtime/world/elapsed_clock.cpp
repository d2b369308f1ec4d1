#include "tspemu/runtime/elapsed_clock.hpp"

#include <fstream>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tspemu {

namespace {

#if defined(__x86_64__)
// Invariant TSC: CPUID 0x80000007, EDX bit 8 (Intel SDM vol. 3B 18.17.1; AMD APM vol. 3, CPUID
// Fn8000_0007_EDX[TscInvariant]): constant rate in every P-, C- and T-state. Then the kernel's
// own choice of clocksource: it keeps "tsc" only while its synchronisation checks across CPUs
// pass (a KVM guest without a stable TSC runs on kvm-clock instead).
bool tsc_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000000u, &eax, &ebx, &ecx, &edx) == 0 || eax < 0x80000007u) return false;
  if (__get_cpuid(0x80000007u, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 8)) == 0) return false;
  std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(source >> name) && name == "tsc";
}

// A TSC reading and the steady_clock time it was taken at: the midpoint of the two steady_clock
// reads around it, from the tightest of a few tries (a preemption between the reads only widens
// a try, which is then not chosen).
struct TscPair {
  double steady_ns;
  std::uint64_t ticks;
};
TscPair tsc_pair() {
  TscPair best{0, 0};
  double best_width = 1e30;
  for (int i = 0; i < 8; ++i) {
    const auto s0 = std::chrono::steady_clock::now();
    const std::uint64_t t = __rdtsc();
    const auto s1 = std::chrono::steady_clock::now();
    const double a = std::chrono::duration<double, std::nano>(s0.time_since_epoch()).count();
    const double b = std::chrono::duration<double, std::nano>(s1.time_since_epoch()).count();
    if (b - a < best_width) {
      best_width = b - a;
      best = {(a + b) / 2, t};
    }
  }
  return best;
}

// Nanoseconds per TSC tick, calibrated once per process; 0 when the TSC is not usable.
double tsc_ns_per_tick() {
  static const double scale = [] {
    if (!tsc_usable()) return 0.0;
    const TscPair a = tsc_pair();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const TscPair b = tsc_pair();
    if (b.ticks <= a.ticks || b.steady_ns <= a.steady_ns) return 0.0;
    return (b.steady_ns - a.steady_ns) / static_cast<double>(b.ticks - a.ticks);
  }();
  return scale;
}
#endif

}  // namespace

ElapsedClock::ElapsedClock(Source source) {
#if defined(__x86_64__)
  if (source == Source::best) ns_per_tick_ = tsc_ns_per_tick();
  origin_ticks_ = __rdtsc();
#else
  (void)source;
#endif
  origin_ = std::chrono::steady_clock::now();
}

}  // namespace tspemu
