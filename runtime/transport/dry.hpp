// DryTransport: the transport of a dry run (WorldOptions::dry_run, core/dry_run.hpp).
//
// What: the shared-memory transport (shared_memory.hpp) with its data movement off for dry-run
// memory: calls meet, fingerprints are compared, steps are posted and waited for, point-to-point
// messages are matched and failures propagate exactly as in a real run, but a copy or sum whose
// source or destination lies in the dry reservation (unbacked arena memory, dry_reservation.hpp)
// moves no byte. The collectives count their calls and bytes (counters.hpp) as in a real run, so a
// dry run measures the real schedule's traffic without its memory or its copies.
// Requirements: none beyond the shared-memory transport's. Host buffers outside the arenas (e.g.
// Comm::split's payloads) are real memory and still travel, since the runtime itself needs them.
// Guarantees: a dry world's counters and arena statistics equal a real world's for the same
// schedule (tests/tsp/cost_model_test.cpp compares them field by field).
// Cost: the meet and waits of a real run; no copies of arena data.
#pragma once

#include "shared_memory.hpp"

namespace tspemu::detail {

class DryTransport final : public SharedMemoryTransport {
 public:
  DryTransport() : SharedMemoryTransport(SkipDryMemory{}) {}
};

}  // namespace tspemu::detail
