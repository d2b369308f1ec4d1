// `tspemu selfcheck`: runs every collective on a world of N ranks with inputs whose sums are exact,
// verifies every result bit for bit, and prints the median time per call and the bytes each rank
// moved. Returns the number of failed checks.
#pragma once

#include "cli_fwd.hpp"

#include <cstddef>
#include <cstdint>
#include <iosfwd>

namespace tspemu::app {

struct SelfcheckOptions {
  int ranks = 4;
  std::size_t count = 1 << 16;  // elements per rank
  int iterations = 20;
};

// The `selfcheck` subcommand of app with its options (--ranks, --count, --iterations; their bounds
// are the option table's, option_table.hpp).
CLI::App* add_selfcheck_command(CLI::App& app, SelfcheckOptions& o);

// The bytes one rank's buffers reach in the largest check, all_to_all's input and output of
// --count x --ranks floats each (a lower bound: the collectives' own staging is not counted).
std::uint64_t selfcheck_rank_bytes(const SelfcheckOptions& opts);
// The memory pre-check `run` has (run_memory.hpp), for selfcheck: ConfigError naming --count and
// --ranks, the bytes per rank and in total, when a rank's buffers pass its arena's `capacity` or
// all ranks' pass `available` (MemAvailable).
void require_selfcheck_memory(const SelfcheckOptions& opts, std::uint64_t available,
                              std::size_t capacity);

// Runs the checks after require_selfcheck_memory with the machine's available memory.
int selfcheck(const SelfcheckOptions& opts, std::ostream& out);

}  // namespace tspemu::app
