// reduce (sum) to a root: the root receives the element-wise sum of every rank's input.
// Layout: send has c elements on every rank; recv has c elements on the root and is ignored
// elsewhere (may be empty).
// Order: group-rank order, as all_reduce; bitwise reproducible.
// In place: on the root send == recv is allowed.
// Cost: one step; the root reads (n-1)·c elements from the others' buffers.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/dtype.hpp"

namespace tspemu {
namespace detail {
void reduce(Comm& comm, const std::byte* send, std::size_t send_count, std::byte* recv,
            std::size_t recv_count, Dtype dtype, int root);
}

template <class T>
void reduce(Comm& comm, std::span<const std::type_identity_t<T>> send,
            std::span<std::type_identity_t<T>> recv, int root) {
  detail::reduce(comm, reinterpret_cast<const std::byte*>(send.data()), send.size(),
                 reinterpret_cast<std::byte*>(recv.data()), recv.size(), dtype_of<T>(), root);
}

}  // namespace tspemu
