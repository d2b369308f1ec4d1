// Causal grouped-query attention core (no projections, no RoPE): softmax(Q Kᵀ / sqrt(hs)) V,
// plus the statistics that let a caller split the keys into blocks (ring attention,
// FlashAttention-2) and still get the full result.
//
// What: each query attends to the keys whose global position is <= its own:
//     visible(i, j)  <=>  k_positions[j] <= q_positions[i]
//   Queries and keys carry explicit global positions, so a rank can attend its local queries
//   (at arbitrary, e.g. zigzag, positions) against a full gathered K/V in any order. Query head h
//   reads K/V head h / (NH / NKV) (grouped-query attention).
//     torch: s = (q @ k.transpose(-2, -1)) / sqrt(hs);  s.masked_fill_(~visible, -inf)
//            out = softmax(s, -1) @ v                    (per batch, per query head)
// Key blocks: there is no key offset or range argument. A block of keys (the K/V block another
//   rank sent round the ring, a chunk of a long sequence) is a call with only that block's K/V,
//   Tk = its length and k_positions = its keys' global positions; the mask follows from them.
//   Attending block by block and folding each partial (out, lse) into a running one with
//   merge_attention_partials gives the attention over the union of the blocks.
// Requirements: NH % NKV == 0; buffers do not alias; positions arrays have Tq / Tk entries.
// Guarantees:
//   - Computed per (batch, head) over blocks of queries with GEMMs (S = Q_blk Kᵀ, then P V);
//     a block only multiplies the key prefix up to the last key visible to any query in it, so
//     sorted key positions (the usual case) skip the masked upper triangle.
//   - forward writes lse[b, h, i] = logsumexp_j visible s[i, j] (the softmax statistic backward
//     reuses instead of storing the T x T probabilities, as in FlashAttention).
//   - A query that sees no key (in this call's keys) gets out = 0, lse = -inf, and contributes
//     no gradient; merge_attention_partials treats such a partial as empty.
//   - Bad dims throw std::invalid_argument naming the function and every dimension.
//   - float with ascending k_positions (every caller's order: a full sequence, a rank's zigzag
//     keys, a ring block): a query's visible keys are a prefix, so masking is a length and the
//     softmax rows run on vector lanes with exp_poly (exp_poly.hpp, <= 1 ulp) and lane partial
//     sums; forward scales each output row by 1 / (its exp sum) after P V instead of normalizing
//     P. double (the oracle), and keys in any other order, run the per-element rows (std::exp,
//     index-order sums). Either way a row's result depends only on its own visible keys, never
//     on the query block or the lane it fell in, so it is bitwise repeatable.
// Which outputs are overwritten and which accumulated:
//   causal_attention_forward       out, lse overwritten
//   attention_row_delta            delta overwritten
//   causal_attention_backward      dq, dk, dv overwritten; with accumulate = true, added to
//   merge_attention_partials       out, lse updated in place (a running result)
// Cost: ~4 * B * NH * hs * (visible pairs) flops forward, 2.5x that backward (S is recomputed);
//   row delta and merge O(B * Tq * NH * hs).
//   The two attention kernels open a ComputeSpan ("attention", "attention backward") with
//   their GEMM FLOPs (core/compute_span.hpp), so a rank's trace and simulated clock see them.
#pragma once

#include <cstdint>

namespace tspemu::ref {

struct AttentionDims {
  int B = 0;    // batch
  int Tq = 0;   // queries per sequence (this rank's tokens)
  int Tk = 0;   // keys per sequence (e.g. the full gathered sequence, or one key block)
  int NH = 0;   // query heads
  int NKV = 0;  // key/value heads
  int hs = 0;   // head size
};

template <class T>
void causal_attention_forward(T* out,                           // [B, Tq, NH, hs]
                              T* lse,                           // [B, NH, Tq]
                              const T* q,                       // [B, Tq, NH, hs]
                              const T* k,                       // [B, Tk, NKV, hs]
                              const T* v,                       // [B, Tk, NKV, hs]
                              const std::int64_t* q_positions,  // [Tq]
                              const std::int64_t* k_positions,  // [Tk]
                              const AttentionDims& d);

// delta[b, h, i] = sum_c dout[b, i, h, c] * out[b, i, h, c]  (uses B, Tq, NH, hs of d)
//   torch: delta = (dout * out).sum(-1).transpose(1, 2)
// Equals rowsum(P ∘ dP) of the backward (dP = dout Vᵀ, out = P V), but over the FULL output: a
// blockwise backward needs it because one key block's rowsum only sees that block's keys.
template <class T>
void attention_row_delta(T* delta,       // [B, NH, Tq], overwritten
                         const T* dout,  // [B, Tq, NH, hs]
                         const T* out,   // [B, Tq, NH, hs]
                         const AttentionDims& d);

// dS = P ∘ (dP - delta), dP = dout Vᵀ;  dq = dS K / sqrt(hs);  dk = dSᵀ Q / sqrt(hs);
// dv = Pᵀ dout;  P = exp(S / sqrt(hs) - lse).
//   delta == nullptr (the one-shot backward): delta = rowsum(P ∘ dP) over this call's keys and lse
//     is the forward's; this path is the reference's and unchanged.
//   delta given (blockwise backward): lse and delta are the statistics of the FULL attention
//     output, merged over every key block (lse from merge_attention_partials, delta from
//     attention_row_delta on the merged out). Then this call's P is the full softmax restricted
//     to its keys, so dk, dv of the block are final and dq is this block's share: calling it once
//     per disjoint key block with accumulate = true (dq zeroed once) gives the full gradient.
//   accumulate: dq, dk, dv are added to instead of overwritten.
template <class T>
void causal_attention_backward(T* dq,          // [B, Tq, NH, hs]
                               T* dk,          // [B, Tk, NKV, hs]
                               T* dv,          // [B, Tk, NKV, hs]
                               const T* dout,  // [B, Tq, NH, hs]
                               const T* q, const T* k, const T* v,
                               const T* lse,  // [B, NH, Tq]
                               const std::int64_t* q_positions, const std::int64_t* k_positions,
                               const AttentionDims& d,
                               const T* delta = nullptr,  // [B, NH, Tq] or nullptr
                               bool accumulate = false);

// Folds a partial attention result over one key block into a running result over the blocks
// seen so far (uses B, Tq, NH, hs of d). Start the running result at out = 0, lse = -inf.
//   lse' = logaddexp(lse, part_lse)
//   out  = out * exp(lse - lse') + part_out * exp(part_lse - lse')
// -inf on either side is an empty side, never NaN: part_lse = -inf leaves the row unchanged;
// lse = -inf copies the partial row exactly (so merging into a fresh result is bitwise the
// partial). The part buffers must not alias out or lse.
template <class T>
void merge_attention_partials(T* out,             // [B, Tq, NH, hs], running, updated
                              T* lse,             // [B, NH, Tq], running, updated
                              const T* part_out,  // [B, Tq, NH, hs]
                              const T* part_lse,  // [B, NH, Tq]
                              const AttentionDims& d);

}  // namespace tspemu::ref
