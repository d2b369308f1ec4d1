// all_reduce (sum): every rank receives the element-wise sum of every rank's input.
// Layout: send and recv have the same count on every rank.
// Order: each element is summed in group-rank order, ((x_0 + x_1) + x_2) + ..., so every rank
// gets bitwise the same result, reproducible run to run and independent of thread timing.
// In place: send == recv is allowed; any other overlap is an error.
// Cost: two steps, reduce-scatter then all-gather over balanced chunks (the first count % n
// chunks one element longer): each rank moves 2(n-1)/n of the buffer, the ring volume. Payloads
// of at most 256 bytes take one step: every rank sums the eager copies itself.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/dtype.hpp"

namespace tspemu {
namespace detail {
void all_reduce(Comm& comm, const std::byte* send, std::size_t send_count, std::byte* recv,
                std::size_t recv_count, Dtype dtype);
}

template <class T>
void all_reduce(Comm& comm, std::span<const std::type_identity_t<T>> send,
                std::span<std::type_identity_t<T>> recv) {
  detail::all_reduce(comm, reinterpret_cast<const std::byte*>(send.data()), send.size(),
                     reinterpret_cast<std::byte*>(recv.data()), recv.size(), dtype_of<T>());
}

// In place.
template <class T>
void all_reduce(Comm& comm, std::span<T> buf) {
  all_reduce<T>(comm, std::span<const T>(buf), buf);
}

}  // namespace tspemu
