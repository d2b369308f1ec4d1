// The memory tests' reading of an arena (baseline_memory_test.cpp, tsp_memory_test.cpp): what a
// request is charged and a category's current and peak bytes. Test-only.
//
// Requirements: none. Guarantees: charged() is the arena's accounting of a request (arena.hpp:
// n bytes are charged round_up(n, 64)), written out here so the tests check the arena against it
// rather than against itself. Cost: O(1).
#pragma once

#include <cstddef>

#include "tspemu/runtime/arena.hpp"

namespace tspemu::tsp::testing {

// The bytes the arena charges for `elements` values of `size` bytes each.
inline std::size_t charged(std::size_t elements, std::size_t size = sizeof(float)) {
  return (elements * size + 63) / 64 * 64;
}
inline std::size_t current(const ArenaStats& a, Category c) {
  return a.category_current[static_cast<std::size_t>(c)];
}
inline std::size_t peak(const ArenaStats& a, Category c) {
  return a.category_peak[static_cast<std::size_t>(c)];
}

}  // namespace tspemu::tsp::testing
