// The files a subcommand writes (--json, --trace, --svg), checked before any work is done, so an
// unwritable path is not discovered after a long run.
//
// What: check_output_files({{"--json", path}, ...}) refuses, with ConfigError naming the flag and
// the path, an output whose directory cannot take a new file (core/atomic_file.hpp's
// check_writable) and two flags naming the same file (one would silently overwrite the other).
// Empty paths are outputs not asked for. The files themselves are written later, atomically.
// Cost: one temporary file made and removed per output.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tspemu::app {

void check_output_files(const std::vector<std::pair<std::string, std::string>>& flag_paths);

}  // namespace tspemu::app
