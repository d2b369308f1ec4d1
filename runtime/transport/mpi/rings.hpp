// ControlRing: control messages between two processes of one node through memory both map
// (rings.cpp; docs/design/mpi-transport.md).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../mpi.hpp"

namespace tspemu::detail {

// One process's control messages to another process of its node, in memory both map (a memfd of
// the reader's, MpiTransport::map_control_rings): one writer (the sending process's poll_mu
// holder) and one reader (the receiving process's), records of an 8-byte size then the message,
// padded to 8 bytes, wrapping around `data`. Positions count bytes since the world began. The
// atomics live in memory mapped by two processes: lock-free, so address-free (static_assert).
constexpr std::size_t kRingBytes = std::size_t{64} << 10;
struct ControlRing {
  // The bytes the reader has copied out: stored (release) by the reader after it copied a record
  // out; the writer's acquire load before it overwrites that space pairs with it.
  alignas(64) std::atomic<std::uint64_t> head;
  // The bytes the writer has published: stored (release) after the writer wrote a record; the
  // reader's acquire load before it reads the record pairs with it.
  alignas(64) std::atomic<std::uint64_t> tail;
  alignas(64) std::byte data[kRingBytes];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::is_trivially_destructible_v<ControlRing>);

// Maps this node's rings (rings.cpp: when and why). Collective over the world.
void map_control_rings(MpiTransport::Progress& p, MPI_Comm node, bool oversubscribed);

}  // namespace tspemu::detail
