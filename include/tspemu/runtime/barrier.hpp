// barrier: returns on a rank only after every rank of the group has entered it.
// Cost: one step, one cache line published per rank.
#pragma once

#include "tspemu/runtime/comm.hpp"

namespace tspemu {
void barrier(Comm& comm);
}
