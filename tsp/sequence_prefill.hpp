// The attention of an SP prefill in which each rank computes only its own prompt tokens (private
// to tspemu::tsp; mesh_decoder.cpp at T = 1, sp_decoder.hpp's ring and Ulysses prefills): ring
// pass-KV and Ulysses, on prompts of unequal lengths laid out by a KvOwnership.
//
// Setting (n = comm.size() ranks, this rank p = comm.rank(), sequence b with a prompt of P_b
//   tokens, own.owned(q, b, P_b) the positions of rank q): `st` is this rank's step — per
//   sequence its own positions, ascending, rows sequence-major — and q [N, NH, hs], k, v
//   [N, NKV, hs] its rows' post-RoPE projections. Both write out [N, NH, hs], the causal attention
//   of each own query over every key of its sequence (on whichever rank), exact up to the order of
//   the softmax sums.
// ring_prefill_attention (pass-KV; the training core ring_attention.hpp's forward, generalized to
//   blocks of unequal size — the training core takes one Tl for every rank and batch, float
//   only): this rank's block [K rows | V rows] of its N_p tokens goes round the ring, n − 1 hops
//   (RingHop, double-buffered, the next block in flight during the current one's compute); at
//   step j the block of rank p − j is attended per sequence (causal by global position, keys
//   ascending) and merged into (out, lse) by merge_attention_partials (step 0, the own block,
//   written directly). lse [NH·N] (sequence b's at NH·offset[b], [NH, count[b]]) is the merged
//   statistic. Traffic: n − 1 sends of 2·N_{p−j}·NKV·hs and n − 1 receives of 2·N_{p−1−j}·NKV·hs
//   elements, all counted into `traffic`.
// ulysses_prefill_attention (the training core ulysses_attention.hpp's exchange —
//   all_to_all_sequence_to_heads / heads_to_sequence — on padded slots; the training core needs
//   one Tl per rank): each rank's rows go to M = Σ_b ceil(P_b/n) slots, sequence b's at slots
//   Σ_{b'<b} m_{b'}.. (m_b = ceil(P_b/n) >= any rank's count), zero-filled past its count; Q, K,
//   V exchanged sequence→heads (rank p keeps heads p·NH/n.., KV heads p·NKV/n..: a local query
//   head j reads local KV head j/g, the GQA grouping is preserved); per sequence the rows are
//   put in position order and attended in one call over all P_b keys (the reference's call on
//   this rank's heads); the outputs go back to the slots and heads→sequence. 4 all-to-alls of
//   M·(NH or NKV)·hs elements, (n − 1)/n of each crossing. lse is not written.
// Requirements: n | NH and n | NKV for Ulysses (the caller checks and names the shape); own
//   covers st's sequences; every rank calls with the same ownership.
// Buffers: the rank's arena, per call (ring: two blocks of the largest N_q, kv; Ulysses: the
//   slots and their exchanged copies, comm; one sequence's position-ordered rows, workspace).
#pragma once

#include "decode_parts.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/kv_ownership.hpp"

namespace tspemu::tsp::detail {

// The attention shape of the step: heads and head size.
struct PrefillHeads {
  int NH = 0, NKV = 0, hs = 0;
};

template <class T>
void ring_prefill_attention(Rank& rank, Comm& comm, const KvOwnership& own, const DecodeStep& st,
                            const T* q, const T* k, const T* v, T* out, T* lse,
                            const PrefillHeads& h, TrafficCounters& traffic);

template <class T>
void ulysses_prefill_attention(Rank& rank, Comm& comm, const KvOwnership& own, const DecodeStep& st,
                               const T* q, const T* k, const T* v, T* out, const PrefillHeads& h,
                               TrafficCounters& traffic);

// This rank's step of a prefill: per sequence its own positions of `prompts` (own.owned(rank, b,
// P_b)), rows sequence-major; a sequence of which it owns nothing has count 0.
DecodeStep own_prefill_step(const DecodeStep& all, const KvOwnership& own, int rank);

}  // namespace tspemu::tsp::detail
