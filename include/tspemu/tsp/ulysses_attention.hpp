// DeepSpeed-Ulysses attention core: causal attention of sequence-sharded tokens by exchanging the
// sequence axis for the head axis. Plug it into SequenceShardedAttention
// (sequence_sharded_attention.hpp) for the block, or into ref::attention_block_forward/backward
// to check it against the reference alone.
//
// What (n ranks, rank p, Tl = S/n local tokens, NHn = NH/n, NKVn = NKV/n):
//   forward   Q [B, Tl, NH, hs] → Qh [B, S, NHn, hs]; K, V [B, Tl, NKV, hs] → [B, S, NKVn, hs]
//             (all_to_all_sequence_to_heads: every rank's tokens, heads p·NHn.. / p·NKVn..);
//             Ah = causal_attention(Qh, Kh, Vh) over the whole sequence on these heads;
//             A = all_to_all_heads_to_sequence(Ah)  [B, Tl, NH, hs]
//             — 4 all-to-alls of B·Tl·(NH or NKV)·hs elements, (n-1)/n of each crossing.
//   backward  Q, K, V exchanged again (the block recomputes them, as the baselines re-gather
//             K/V), dA → heads, the one-shot attention backward on the whole sequence, dQ, dK,
//             dV → sequence: 7 all-to-alls. No reduction: each rank owns its heads' gradients.
// GQA: local query head j of rank p is global head p·NHn + j, which reads KV head
//   (p·NHn + j)/g = p·NKVn + j/g, the local KV head j/g: the shard is self-contained.
// Order: the exchange gathers tokens rank-major (sequence_heads_exchange.hpp). Queries stay in
//   that order with their gathered positions; K and V are permuted into position order, so the
//   kernel's causal key prefix skips the masked keys (zigzag rank-major keys would make it visit
//   about 3/4 of the S² pairs instead of 1/2). lse [B, NHn, S] is written, in the gathered query
//   order, into the block's lse buffer [B, NH, Tl] (the same element count; only this core reads
//   it back).
// Sub-groups: the exchange runs on any Comm (a mesh axis, runtime/mesh.hpp) whose members hold
//   Tl tokens each at global positions the caller names (a subset of the sequence: the keys
//   are then the group's tokens, in their position order). An inner core replaces the local
//   attention on the heads layout: it gets Q, K, V (and in backward A and dA, A exchanged once
//   more: 8 all-to-alls) all in ascending position order of the group's n·Tl tokens, with those
//   positions and dims {B, n·Tl, n·Tl, NH/n, NKV/n, hs}; USP is this core with ring attention
//   across the rows of a mesh as its inner core (tsp/usp.hpp).
// Requirements: n | NH and n | NKV (check_ulysses_shape; std::invalid_argument naming the values);
//   the block's dims must be the shape's (checked per call).
// Buffers (the rank's Arena, per call): Qh and Ah / dAh, dQh (workspace, B·Tl·NH·hs each); Kh, Vh
//   and dKh, dVh in position order (kv, B·Tl·NKV·hs each); one exchange buffer for K, V, dK, dV
//   in gathered order (comm, B·Tl·NKV·hs); for the life of the core: the gathered positions and
//   0..S-1 (other, S int64 each).
// n = 1: the exchanges are copies, still called (counted as all_to_all with 0 bytes); the result
//   is bitwise the reference core's.
// Cost: as the reference attention over S queries on NH/n heads, plus the copies.
#pragma once

#include <cstdint>
#include <span>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"

namespace tspemu::tsp {

// Throws std::invalid_argument unless shape.Sp (the Ulysses degree n) divides the query and the
// key/value heads (the strategy table's Ulysses rules, strategy.hpp), and the rest of the shape is
// valid for SequenceShardedAttention.
void check_ulysses_shape(const BaselineShape& shape);

// The core of rank.id() for `shape` (T = 1, Sp = rank.size(), layout row_layout()).
ref::AttentionCore<float> ulysses_attention_core(Rank& rank, const BaselineShape& shape);

// The core of this rank on the Ulysses group `group` (n = group.size()): dims the block's local
// {B, Tl, Tl, NH, NKV, hs}; positions [n·Tl] member q's global positions at [q·Tl, (q+1)·Tl) in
// its local order; inner empty (the local causal attention, as above) or the core run on the
// heads layout. std::invalid_argument unless n | NH, n | NKV and positions.size() = n·Tl.
ref::AttentionCore<float> ulysses_attention_core(Comm& group, Arena& arena,
                                                 const ref::AttentionDims& dims,
                                                 std::span<const std::int64_t> positions,
                                                 ref::AttentionCore<float> inner = {});

}  // namespace tspemu::tsp
