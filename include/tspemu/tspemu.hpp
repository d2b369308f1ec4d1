// tspemu.hpp: the one header a user's schedule includes.
//
// What: the public API a schedule written outside the library needs — ranks and their arenas
// (runtime/world.hpp), every collective (runtime/collectives.hpp), named mesh axes made by
// Comm::split (runtime/mesh.hpp), the token layouts (tsp/sequence_layout.hpp), the attention
// cores on any group (ring, Ulysses, USP) and the sequence-sharded block around them, and the
// check kit that judges a schedule against the reference (check/block_check.hpp,
// check/replicated_weights.hpp). The built-in strategies' blocks and the planner have their own
// headers (tsp/strategy.hpp, plan/strategy_table.hpp).
// Requirements: the installed tspemu (find_package(tspemu) or pkg-config), C++20.
// Guarantees: includes only; each header it names states its own contract.
// Cost: compile time only.
#pragma once

#include "tspemu/check/block_check.hpp"
#include "tspemu/check/replicated_weights.hpp"
#include "tspemu/check/token_shards.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/mesh.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/ring_attention.hpp"
#include "tspemu/tsp/sequence_layout.hpp"
#include "tspemu/tsp/sequence_sharded_attention.hpp"
#include "tspemu/tsp/ulysses_attention.hpp"
#include "tspemu/tsp/usp_attention.hpp"
