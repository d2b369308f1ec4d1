// Checks for calls that must fail: a bad argument caught on the rank that made it, and a run in
// which every rank throws the same typed runtime failure.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace tspemu::test {

inline ::testing::AssertionResult has_part(const std::string& s, const std::string& part) {
  if (s.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << s << "\" does not contain \"" << part << "\"";
}

// f() must throw std::invalid_argument whose message has every part.
template <class F>
void expect_bad_argument(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    for (const auto& p : parts) EXPECT_TRUE(has_part(e.what(), p));
  }
}

// Runs fn on every rank of `world`: every rank must throw an E whose message has every part, and
// World::run must report it; then the world must still run a collective.
template <class E>
void expect_every_rank_throws(World& world, const std::function<void(Rank&)>& fn,
                              const std::vector<std::string>& parts) {
  std::atomic<int> thrown{0};
  try {
    world.run([&](Rank& r) {
      try {
        fn(r);
      } catch (const E& e) {
        ++thrown;
        for (const auto& p : parts) EXPECT_TRUE(has_part(e.what(), p)) << "rank " << r.id();
        throw;
      }
    });
    ADD_FAILURE() << "World::run did not throw";
  } catch (const RankFailure& f) {
    EXPECT_TRUE(cause_is<E>(f)) << f.what();
    for (const auto& p : parts) EXPECT_TRUE(has_part(f.what(), p));
  }
  EXPECT_EQ(thrown.load(), world.size());
  world.run([](Rank& r) { barrier(r.comm()); });
}

}  // namespace tspemu::test
