// all_to_all: rank r's block q goes to rank q's block r.
// Layout: send and recv have size()·c elements; recv_r[q·c, (q+1)·c) = send_q[r·c, (r+1)·c).
// In place: not supported; send and recv must not overlap.
// Cost: one step; each rank reads (n-1) blocks of c from the others.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/dtype.hpp"

namespace tspemu {
namespace detail {
void all_to_all(Comm& comm, const std::byte* send, std::size_t send_count, std::byte* recv,
                std::size_t recv_count, Dtype dtype);
}

template <class T>
void all_to_all(Comm& comm, std::span<const std::type_identity_t<T>> send,
                std::span<std::type_identity_t<T>> recv) {
  detail::all_to_all(comm, reinterpret_cast<const std::byte*>(send.data()), send.size(),
                     reinterpret_cast<std::byte*>(recv.data()), recv.size(), dtype_of<T>());
}

}  // namespace tspemu
