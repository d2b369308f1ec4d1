// Injection: seeded perturbation of a run's timing and delivery order, to shake out schedules
// whose result depends on thread timing.
//
// What, with WorldOptions::inject (or World::set_injection) on, from each rank's own random
// stream (seed, rank):
//   - rank delays: every collective, send and receive is delayed, with `probability`, by a
//     uniform random sleep of at most `max_delay` before it starts; a failure elsewhere ends a
//     sleep within milliseconds (the rank then stops at its next wait);
//   - message delays: a send is delayed the same way again before its message is posted;
//   - delivery order: wait_any (send_recv.hpp) completes the pending receives in a seeded random
//     order instead of their order of arrival.
// Guarantees: a correct schedule (one whose result does not depend on arrival order) gives
// bitwise the same result under every seed. A rank's sequence of operations, and so its event
// order, is a function of the seed: the delays change when things happen, never what each rank
// does next, and the delivery order comes from the seed, not from timing. A run that fails under
// injection names its seed in the error; rerunning with that seed reproduces the event order.
// check_deterministic runs a schedule over many seeds and names the first that changes it.
//
// Example:
//   World world({.ranks = 4});
//   check_deterministic(world, {.seed = 1}, 32, [&] {
//     world.run(schedule);
//     return result_bytes();
//   });  // throws NondeterminismError naming the seed, or returns
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tspemu/runtime/error.hpp"

namespace tspemu {

class World;

// The longest injected delay a world with this hang timeout accepts: a quarter of it, so a peer
// waiting on a delayed rank (a send draws two delays, and operations follow one another) is not
// failed as hung.
std::chrono::microseconds max_injection_delay(std::chrono::milliseconds hang_timeout);

struct Injection {
  std::uint64_t seed = 1;
  double probability = 0.25;  // chance that an operation (or a message) is delayed
  std::chrono::microseconds max_delay{200};
  // Throws std::invalid_argument unless 0 <= probability <= 1 and
  // 0 <= max_delay <= max_injection_delay(hang_timeout), naming the value and the bound.
  void validate(std::chrono::milliseconds hang_timeout) const;
  // "injection seed 7 (delay p=0.25, at most 200 us)".
  std::string describe() const;
};

// A rank's random stream for injection (splitmix64 of seed and rank): reset at every run start,
// used by that rank's thread only.
class InjectionStream {
 public:
  void reset(std::uint64_t seed, int rank) {
    state_ = seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(rank) + 1;
  }
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }

 private:
  std::uint64_t state_ = 0;
};

class NondeterminismError : public Error {
 public:
  NondeterminismError(std::uint64_t seed, const std::string& what) : Error(what), seed_(seed) {}
  std::uint64_t seed() const { return seed_; }

 private:
  std::uint64_t seed_;
};

// Runs `run` once without injection, then with injection seeds base.seed, base.seed + 1, ...
// (`seeds` of them). `run` runs the schedule on `world` and returns its result as bytes. Throws
// NondeterminismError naming the first seed whose result differs from the run without injection
// (with the first differing byte); a failure of `run` under a seed is rethrown as it is (its
// message names the seed). Restores the world's injection setting before returning or throwing.
void check_deterministic(World& world, const Injection& base, int seeds,
                         const std::function<std::vector<std::byte>()>& run);

// The bytes of a result, for check_deterministic.
template <class T>
void append_bytes(std::vector<std::byte>& out, std::span<const T> values) {
  const auto* p = reinterpret_cast<const std::byte*>(values.data());
  out.insert(out.end(), p, p + values.size_bytes());
}

}  // namespace tspemu
