// Sum reductions over a set of buffers (e.g. a layer's gradient tensors) in one collective, in
// place.
//
// all_reduce_buffers: buffer i becomes the element-wise sum over the ranks of their buffer i.
// reduce_scatter_buffers: with c_i = buffers[i].size() / n, block r of buffer i on rank r
//   (elements [r·c_i, (r+1)·c_i)) becomes the sum over the ranks of their block r of buffer i; the
//   other blocks are left as they were (the in-place form of reduce_scatter, on every buffer).
// Order: every element is summed in group-rank order, ((x_0 + x_1) + x_2) + ..., as all_reduce and
// reduce_scatter do: results are bitwise equal to calling those on each buffer in turn.
// Requirements: every rank passes the same number of buffers with the same sizes in the same
// order, else every rank throws CollectiveMismatch naming rank 0's set and the differing ones;
// the buffers of a set do not overlap; for reduce_scatter_buffers each size is a multiple of n.
// Empty buffers and an empty set are allowed (still one collective that every rank calls).
// Guarantees: one collective (one sequence number) whatever the number of buffers; no heap
// allocation. Counters: all_reduce_buffers is one all_reduce call moving what an all_reduce of the
// buffers' concatenation moves (2(n-1)/n of it when n divides its count); reduce_scatter_buffers
// is one reduce_scatter call moving the sum of the per-buffer reduce_scatters.
// Cost: single copy from the peers' buffers, no scratch. all_reduce_buffers: two steps, each rank
// sums its balanced chunk of the concatenation (so the ranks share the work even when each buffer
// is small), then copies the other chunks from their owners. reduce_scatter_buffers: one step,
// (n-1)/n of every buffer read per rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/dtype.hpp"

namespace tspemu {
namespace detail {
// Defined for float, double, int32 and int64.
template <class T>
void all_reduce_buffers(Comm& comm, std::span<const std::span<T>> buffers);
template <class T>
void reduce_scatter_buffers(Comm& comm, std::span<const std::span<T>> buffers);
}  // namespace detail

template <class T>
void all_reduce_buffers(Comm& comm, std::span<const std::span<std::type_identity_t<T>>> buffers) {
  static_assert(dtype_of<T>() != Dtype::byte, "all_reduce_buffers cannot sum raw bytes");
  detail::all_reduce_buffers<T>(comm, buffers);
}

template <class T>
void reduce_scatter_buffers(Comm& comm,
                            std::span<const std::span<std::type_identity_t<T>>> buffers) {
  static_assert(dtype_of<T>() != Dtype::byte, "reduce_scatter_buffers cannot sum raw bytes");
  detail::reduce_scatter_buffers<T>(comm, buffers);
}

}  // namespace tspemu
