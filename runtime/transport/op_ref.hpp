// OpRef: names the operation a rank is in (operation, sequence number, group, peer, what it
// awaits), for the error messages of every transport's waits and for the watchdog's diagnoses.
#pragma once

#include <cstdint>

namespace tspemu::detail {

struct Group;

// Names the operation a rank is in, for error messages; formatted only when an error is raised,
// so the hot path never builds strings.
struct OpRef {
  const char* what = "";  // "all_gather", "recv", ...
  std::uint64_t seq = 0;  // collective number on the group, or message number
  const Group* group = nullptr;
  int peer_group_rank = -1;  // for point-to-point
  const char* stage = "";    // what is awaited: "every member to enter", "the message", ...
  std::uint64_t bytes = 0;   // the call's payload, count x element size
};

}  // namespace tspemu::detail
