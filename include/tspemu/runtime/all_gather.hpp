// all_gather: every rank receives every rank's contribution, concatenated in group-rank order.
// Layout (equal counts): send has c elements on every rank; recv has size()·c, and
//   recv[r·c, (r+1)·c) = send of group rank r.
// Variable counts (all_gatherv): rank r contributes c_r elements (counts may differ, even be 0);
//   recv has Σ c_r and holds the contributions back to back in rank order.
// In place: send may be exactly this rank's block of recv; any other overlap is an error.
// Cost: one step; each rank copies the (n-1) other blocks straight from their owners' buffers
// ((n-1)/n of recv, the ring volume); an owner returns when every rank has copied its block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/dtype.hpp"

namespace tspemu {
namespace detail {
// blocks_present: blocks of recv already in place (bit r: rank r's, equal counts only), which the
// call does not copy (the non-blocking form's early copies, runtime/transport/early_exposure.hpp).
void all_gather(Comm& comm, const std::byte* send, std::size_t count, std::byte* recv,
                std::size_t recv_count, Dtype dtype, bool variable,
                std::uint32_t blocks_present = 0);
}  // namespace detail

template <class T>
void all_gather(Comm& comm, std::span<const std::type_identity_t<T>> send,
                std::span<std::type_identity_t<T>> recv) {
  detail::all_gather(comm, reinterpret_cast<const std::byte*>(send.data()), send.size(),
                     reinterpret_cast<std::byte*>(recv.data()), recv.size(), dtype_of<T>(), false);
}

template <class T>
void all_gatherv(Comm& comm, std::span<const std::type_identity_t<T>> send,
                 std::span<std::type_identity_t<T>> recv) {
  detail::all_gather(comm, reinterpret_cast<const std::byte*>(send.data()), send.size(),
                     reinterpret_cast<std::byte*>(recv.data()), recv.size(), dtype_of<T>(), true);
}

}  // namespace tspemu
