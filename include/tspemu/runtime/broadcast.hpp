// broadcast: the root's buffer is copied to every rank of the group.
// Layout: one buffer of `count` elements on every rank; in place by definition (the root's is the
// source, every other rank's is overwritten). All ranks must pass the same count and root.
// Cost: one step; every non-root rank copies count elements straight from the root's buffer
// (single copy; the root returns when every rank has copied).
// Eager form (payloads of at most 256 bytes): the root copies its buffer into the mailbox and
// returns at once, so it may reuse the buffer immediately; each other rank waits for the root
// alone. A rank may thus be up to 15 such broadcasts ahead of the slowest member. Mismatched
// calls are still errors on every rank: a rank whose call differs from the root's throws
// CollectiveMismatch at once; the others (the root among them) at their next collective on the
// group that meets every member, or when their run function returns (World::run then throws).
// A failure of another rank likewise reaches them there, not inside the broadcast.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/dtype.hpp"

namespace tspemu {
namespace detail {
void broadcast(Comm& comm, std::byte* buf, std::size_t count, Dtype dtype, int root);
}

template <class T>
void broadcast(Comm& comm, std::span<std::type_identity_t<T>> buf, int root) {
  detail::broadcast(comm, reinterpret_cast<std::byte*>(buf.data()), buf.size(), dtype_of<T>(),
                    root);
}

}  // namespace tspemu
