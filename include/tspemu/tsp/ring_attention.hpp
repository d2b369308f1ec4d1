// Ring attention core: causal attention of sequence-sharded tokens by passing K/V blocks round the
// ring of ranks and merging the partial outputs by their log-sum-exp. Plug it into
// SequenceShardedAttention (sequence_sharded_attention.hpp) for the block, or into
// ref::attention_block_forward/backward to check it against the reference alone.
//
// What (n ranks, rank p, its Tl = S/n tokens at zigzag positions; next = p+1, prev = p-1 mod n):
//   forward   step j = 0..n-1 holds the K/V block of rank src = p-j (its global positions give the
//             causal mask): (A_j, lse_j) = causal_attention(Q, K_src, V_src), folded into the
//             running (A, lse) by merge_attention_partials (step 0 writes it directly). Before
//             computing step j < n-1, the block is sent on to next and the following one received
//             from prev (non-blocking, double-buffered): n-1 hops of the K/V block.
//   backward  delta = rowsum(dA ∘ A) of the full output (attention_row_delta); the K/V blocks go
//             round again, each with a dK/dV accumulator that travels with it: at step j rank p
//             adds its queries' share (causal_attention_backward with the full lse and delta,
//             accumulate) to the accumulator of block src and passes both on. After the n-th
//             holder (p-1 for block p) the accumulator returns to its owner: n-1 hops of K/V and
//             n hops of dK/dV. dQ accumulates locally over the n blocks.
// Zigzag: every rank holds chunks r and 2n-1-r, so each step's causal work is the same on every
//   rank; keys of a block are in ascending position, so the kernel skips masked key suffixes.
// Order: every sum has a fixed order (blocks in ring order, accumulators in holder order), so
//   results are bitwise reproducible and independent of message timing.
// Sub-groups: the ring is any Comm (a mesh axis, runtime/mesh.hpp), its members holding Tl tokens
//   each whose global positions the caller names; the Rank& form is the world's ring on the
//   shape's zigzag rows. USP runs it across the rows of a mesh on the Ulysses heads layout.
// Requirements: the dims it was built for at every call (checked); positions from the caller.
// Buffers (the rank's Arena, n > 1): forward — two K/V blocks [2, B, Tl, NKV, hs] (kv) and the
//   partial output and lse of one block (workspace); backward — two K/V blocks and two dK/dV
//   accumulators (kv), delta [B, NH, Tl] (workspace); for the life of the core: every rank's
//   positions (other, S int64).
// n = 1: no message; the calls are the reference core's (bitwise equal to it).
// Cost: the reference attention of the Tl local queries against all S keys, one key block per call
//   (masked suffixes skipped), plus one merge per block forward; forward sends and receives n-1
//   blocks of 2·B·Tl·NKV·hs elements, backward 2n-1.
#pragma once

#include <cstdint>
#include <span>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"

namespace tspemu::tsp {

// The core of rank.id() for `shape` (T = 1, Sp = rank.size(), layout row_layout()).
ref::AttentionCore<float> ring_attention_core(Rank& rank, const BaselineShape& shape);

// The core of this rank on the ring `group` (n = group.size(), the rank's place in the ring is
// group.rank()): dims are the block's local {B, Tl, Tl, NH, NKV, hs}; positions [n·Tl] hold member
// q's global positions at [q·Tl, (q+1)·Tl), in each member's local order (its K/V block's keys,
// ascending for the kernel's masked-suffix skip). Buffers in `arena`, this rank's.
// std::invalid_argument unless positions.size() = n·Tl and Tq = Tk.
ref::AttentionCore<float> ring_attention_core(Comm& group, Arena& arena,
                                              const ref::AttentionDims& dims,
                                              std::span<const std::int64_t> positions);

}  // namespace tspemu::tsp
