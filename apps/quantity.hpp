// Quantities the command line gives with units: counts ("128K") and byte sizes ("80GiB").
//
// What: parse_count reads a whole count with an optional K (1024) or M (1024²) suffix;
//   parse_bytes reads a size that must carry a unit (B, KB..TB decimal, KiB..TiB binary; case does
//   not matter).
// Guarantees: a text that is not such a quantity throws ConfigError naming `flag` and the text;
//   counts lie in [1, kMaxCount], so products of counts in the planner's figures stay far inside
//   int64. Pure functions (the option table and the fuzzed --config parser use them without the
//   commands).
#pragma once

#include <cstdint>
#include <string>

namespace tspemu::app {

inline constexpr std::int64_t kMaxCount = std::int64_t{1} << 40;
std::int64_t parse_count(const std::string& flag, const std::string& text);
double parse_bytes(const std::string& flag, const std::string& text);

}  // namespace tspemu::app
