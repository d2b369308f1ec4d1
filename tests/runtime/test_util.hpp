// Helpers shared by the runtime tests: exact test values, the traffic formulas of counters.hpp,
// sanitizer-aware sweep limits, thread-safe comparisons.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::test {

// ThreadSanitizer makes the runtime ~10x slower: heavy sweeps shrink under it (or when
// TSPEMU_TEST_QUICK is set), keeping every kind and world size.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kUnderTsan = true;
#else
inline constexpr bool kUnderTsan = false;
#endif
#else
inline constexpr bool kUnderTsan = false;
#endif

inline bool quick() {
  static const bool q = kUnderTsan || std::getenv("TSPEMU_TEST_QUICK") != nullptr;
  return q;
}

inline const std::vector<int>& world_sizes() {
  static const std::vector<int> s = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
  return s;
}

// One World per size, kept for the whole program (World threads are kept between runs).
inline World& shared_world(int n) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<World>> worlds;
  std::lock_guard lock(mu);
  auto& w = worlds[n];
  if (!w)
    w = std::make_unique<World>(WorldOptions{.ranks = n, .hang_timeout = std::chrono::seconds(20)});
  return *w;
}

// Small integers: every sum over at most 64 ranks is exact in float, in any order.
template <class T>
T value(int rank, std::size_t i, int salt = 0) {
  const long v =
      static_cast<long>(
          (static_cast<std::size_t>(rank) * 7 + i * 3 + static_cast<std::size_t>(salt) * 11) % 17) -
      8;
  return static_cast<T>(v);
}

// Compares element by element, bit for bit (memcmp), reports the first difference once. Callable
// from rank threads (gtest failures are thread-safe).
template <class T>
bool same(std::span<const T> got, std::span<const T> want, const std::string& ctx) {
  if (got.size() != want.size()) {
    ADD_FAILURE() << ctx << ": size " << got.size() << " != " << want.size();
    return false;
  }
  if (got.empty() || std::memcmp(got.data(), want.data(), got.size_bytes()) == 0) return true;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << ctx << ": element " << i << " is " << got[i] << ", expected " << want[i];
      return false;
    }
  return true;
}
template <class T>
bool same(const std::vector<T>& got, const std::vector<T>& want, const std::string& ctx) {
  return same<T>(std::span<const T>(got), std::span<const T>(want), ctx);
}

// Balanced chunk of all_reduce (all_reduce.hpp): the first count % n chunks one longer.
inline std::size_t chunk_begin(std::size_t count, std::size_t n, std::size_t c) {
  return c * (count / n) + std::min(c, count % n);
}

struct Traffic {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
};

// Expected per-rank traffic (counters.hpp) for a call of `kind` on a group of n ranks where this
// rank is `me`; `bytes` is the per-rank payload N (for reduce_scatter, the send buffer n·c; for
// all_to_all, the whole send buffer).
inline Traffic expected_traffic(CollectiveKind kind, std::size_t n, std::size_t me, int root,
                                std::size_t bytes, std::size_t es) {
  switch (kind) {
    case CollectiveKind::broadcast:
      return static_cast<int>(me) == root ? Traffic{(n - 1) * bytes, 0} : Traffic{0, bytes};
    case CollectiveKind::all_gather:
      return {(n - 1) * bytes, (n - 1) * bytes};
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all:
      return {(n - 1) * (bytes / n), (n - 1) * (bytes / n)};
    case CollectiveKind::all_reduce: {
      // reduce_scatter + all_gather over balanced chunks.
      const std::size_t count = bytes / es;
      const std::size_t mine = (chunk_begin(count, n, me + 1) - chunk_begin(count, n, me)) * es;
      return {(bytes - mine) + (n - 1) * mine, (n - 1) * mine + (bytes - mine)};
    }
    case CollectiveKind::reduce:
      return static_cast<int>(me) == root ? Traffic{0, (n - 1) * bytes} : Traffic{bytes, 0};
    default:
      return {};
  }
}

// Checks the counter delta of one call against the formula.
class CounterProbe {
 public:
  CounterProbe(Rank& r, CollectiveKind k) : r_(r), k_(k), before_(r.counters()[k]) {}
  void expect(Traffic t, const std::string& ctx, std::uint64_t calls = 1) {
    const auto& now = r_.counters()[k_];
    EXPECT_EQ(now.calls - before_.calls, calls) << ctx;
    EXPECT_EQ(now.bytes_sent - before_.bytes_sent, t.sent) << ctx << " bytes_sent";
    EXPECT_EQ(now.bytes_received - before_.bytes_received, t.received) << ctx << " bytes_received";
  }

 private:
  Rank& r_;
  CollectiveKind k_;
  TrafficCounters::Entry before_;
};

// Whether the original exception of a failed run is an E.
template <class E>
bool cause_is(const RankFailure& f) {
  try {
    std::rethrow_exception(f.cause());
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

// Counts this process's threads (entries of /proc/self/task).
// Threads of this process. The first thread a process creates can also start helper threads of
// its own (ThreadSanitizer's background thread), so a baseline is taken after one throwaway
// thread has come and gone.
inline int thread_count() {
  static const bool warmed_up = [] {
    std::thread([] {}).join();
    return true;
  }();
  (void)warmed_up;
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Passes when `part` occurs in `s`; the failure message quotes both.
inline ::testing::AssertionResult contains(const std::string& s, const std::string& part) {
  if (s.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << s << "\" does not contain \"" << part << "\"";
}

// Runs fn on the world, expects RankFailure; returns it (and, if `took` is given, the time the
// run took to fail).
template <class F>
RankFailure expect_failure(World& w, F&& fn, std::chrono::steady_clock::duration* took = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    w.run(fn);
  } catch (const RankFailure& f) {
    if (took != nullptr) *took = std::chrono::steady_clock::now() - t0;
    return f;
  }
  ADD_FAILURE() << "World::run did not throw";
  return RankFailure(-1, "", nullptr);
}

}  // namespace tspemu::test
