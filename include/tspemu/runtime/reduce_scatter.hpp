// reduce_scatter (sum): rank r receives block r of the element-wise sum of every rank's input.
// Layout: send has size()·c elements, recv has c; recv = Σ_q send_q[r·c, (r+1)·c).
// Order: each element is summed in group-rank order, ((x_0 + x_1) + x_2) + ..., on every run: the
// result is bitwise reproducible and independent of thread timing.
// In place: recv may be exactly this rank's block of send; any other overlap is an error.
// Cost: one step; each rank reads block r from the n-1 others ((n-1)/n of send, the ring volume).
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/dtype.hpp"

namespace tspemu {
namespace detail {
void reduce_scatter(Comm& comm, const std::byte* send, std::size_t send_count, std::byte* recv,
                    std::size_t recv_count, Dtype dtype);
}

template <class T>
void reduce_scatter(Comm& comm, std::span<const std::type_identity_t<T>> send,
                    std::span<std::type_identity_t<T>> recv) {
  detail::reduce_scatter(comm, reinterpret_cast<const std::byte*>(send.data()), send.size(),
                         reinterpret_cast<std::byte*>(recv.data()), recv.size(), dtype_of<T>());
}

}  // namespace tspemu
