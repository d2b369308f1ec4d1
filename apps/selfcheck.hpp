// `tspemu selfcheck`: runs every collective on a world of N ranks with inputs whose sums are exact,
// verifies every result bit for bit, and prints the median time per call and the bytes each rank
// moved. Returns the number of failed checks.
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
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
int selfcheck(const SelfcheckOptions& opts, std::ostream& out);

}  // namespace tspemu::app
