// `tspemu selfcheck`: runs every collective on a world of N ranks with inputs whose sums are exact,
// verifies every result bit for bit, and prints the median time per call and the bytes each rank
// moved. Returns the number of failed checks.
#pragma once

#include <cstddef>
#include <iosfwd>

namespace tspemu::app {

struct SelfcheckOptions {
  int ranks = 4;
  std::size_t count = 1 << 16;  // elements per rank
  int iterations = 20;
};

int selfcheck(const SelfcheckOptions& opts, std::ostream& out);

}  // namespace tspemu::app
