// Argument checks shared by the collectives: programming errors throw std::invalid_argument at
// once, before the call touches the mailbox, naming the rank, the operation and the values.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include "../transport/call.hpp"
#include "tspemu/runtime/comm.hpp"

namespace tspemu::detail {

// The error paths are cold and out of line: every collective and message runs these checks, and
// the message formatting inlined beside them cost their fast paths registers and instructions.
[[noreturn, gnu::cold, gnu::noinline]] inline void bad_argument(const Comm& c, const char* op,
                                                                const std::string& what) {
  throw std::invalid_argument("rank " + std::to_string(c.valid() ? c.world_rank(c.rank()) : -1) +
                              ": " + op + " on group " + c.name() + ": " + what);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void invalid_comm(const char* op) {
  throw std::invalid_argument(std::string(op) +
                              " on an invalid Comm (this rank is not in the group)");
}

inline void check_comm(const Comm& c, const char* op) {
  if (!c.valid()) [[unlikely]]
    invalid_comm(op);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void bad_rank(const Comm& c, const char* op,
                                                            const char* role, int rank) {
  bad_argument(c, op,
               std::string(role) + " " + std::to_string(rank) + " is outside the group of " +
                   std::to_string(c.size()) + " ranks");
}

inline void check_root(const Comm& c, const char* op, int root) {
  if (root < 0 || root >= c.size()) [[unlikely]]
    bad_rank(c, op, "root", root);
}

inline void check_count(const Comm& c, const char* op, const char* buffer, std::size_t have,
                        std::size_t need) {
  if (have != need)
    bad_argument(c, op,
                 std::string(buffer) + " has " + std::to_string(have) + " elements, needs " +
                     std::to_string(need));
}

inline bool overlaps(const std::byte* a, std::size_t an, const std::byte* b, std::size_t bn) {
  return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

}  // namespace tspemu::detail
