// Sequence <-> heads exchange (DeepSpeed-Ulysses): the all-to-all that turns a sequence-sharded
// tensor into a head-sharded one, so attention runs over the whole sequence on H/n heads, and
// its inverse.
//
// Layout (n = size(), r = rank(), Hn = H/n; the shape is always given from the sequence side):
//   all_to_all_sequence_to_heads   in  [B, S_local, H, hs]     this rank's tokens, every head
//                                  out [B, n·S_local, Hn, hs]  every rank's tokens, heads of r
//       out_r[b, q·S_local + s, j, :] = in_q[b, s, r·Hn + j, :]
//   all_to_all_heads_to_sequence   in  [B, n·S_local, Hn, hs]  out [B, S_local, H, hs]
//       out_r[b, s, q·Hn + j, :] = in_q[b, r·S_local + s, j, :]       (the exact inverse)
// Rank r holds heads [r·Hn, (r+1)·Hn).
// Sequence order: the gathered sequence is rank-major, whatever layout (contiguous, zigzag,
// striped) gave the ranks their tokens: token q·S_local + s of out is local token s of rank q. A
// caller that needs global positions (causal mask, RoPE) concatenates the ranks' position lists
// in rank order; this collective never reorders tokens.
// Requirements: H divisible by n; in and out have B·S_local·H·hs elements each and do not overlap
// (no in-place form); every rank passes the same shape and direction, else every rank throws
// CollectiveMismatch naming rank 0's call and the differing ones.
// Guarantees: exact copies; one collective (one sequence number), counted as all_to_all with the
// bytes an all_to_all of the same tensor moves; no heap allocation.
// Cost: one step, single copy, no scratch: each rank reads its Hn heads of every token straight
// from each peer's in (B·S_local strided blocks of Hn·hs elements per peer), (n-1)/n of the tensor.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/dtype.hpp"

namespace tspemu {

// The sequence-sharded side of the exchange.
struct SequenceHeadsShape {
  std::size_t B = 0;        // sequences in the micro-batch
  std::size_t S_local = 0;  // tokens per rank
  std::size_t H = 0;        // heads, all of them
  std::size_t hs = 0;       // head size
};

namespace detail {
void sequence_heads_exchange(Comm& comm, const std::byte* in, std::size_t in_count, std::byte* out,
                             std::size_t out_count, Dtype dtype, const SequenceHeadsShape& shape,
                             bool to_heads);

template <class T>
void sequence_heads_exchange(Comm& comm, std::span<const T> in, std::span<T> out,
                             const SequenceHeadsShape& shape, bool to_heads) {
  sequence_heads_exchange(comm, reinterpret_cast<const std::byte*>(in.data()), in.size(),
                          reinterpret_cast<std::byte*>(out.data()), out.size(), dtype_of<T>(),
                          shape, to_heads);
}
}  // namespace detail

template <class T>
void all_to_all_sequence_to_heads(Comm& comm, std::span<const std::type_identity_t<T>> in,
                                  std::span<std::type_identity_t<T>> out,
                                  const SequenceHeadsShape& shape) {
  detail::sequence_heads_exchange<T>(comm, in, out, shape, /*to_heads=*/true);
}

template <class T>
void all_to_all_heads_to_sequence(Comm& comm, std::span<const std::type_identity_t<T>> in,
                                  std::span<std::type_identity_t<T>> out,
                                  const SequenceHeadsShape& shape) {
  detail::sequence_heads_exchange<T>(comm, in, out, shape, /*to_heads=*/false);
}

}  // namespace tspemu
