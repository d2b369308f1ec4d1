// broadcast: the root's buffer is copied to every rank of the group.
// Layout: one buffer of `count` elements on every rank; in place by definition (the root's is the
// source, every other rank's is overwritten). All ranks must pass the same count and root.
// Cost: one step; every non-root rank copies count elements straight from the root's buffer
// (single copy; the root returns when every rank has copied). Payloads of at most 256 bytes are
// copied eagerly into the mailbox and the root returns at once.
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
