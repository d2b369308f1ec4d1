// Causal grouped-query attention core (no projections, no RoPE): softmax(Q Kᵀ / sqrt(hs)) V.
//
// What: each query attends to the keys whose global position is <= its own:
//     visible(i, j)  <=>  k_positions[j] <= q_positions[i]
//   Queries and keys carry explicit global positions, so a rank can attend its local queries
//   (at arbitrary, e.g. zigzag, positions) against a full gathered K/V in any order. Query head h
//   reads K/V head h / (NH / NKV) (grouped-query attention).
//     torch: s = (q @ k.transpose(-2, -1)) / sqrt(hs);  s.masked_fill_(~visible, -inf)
//            out = softmax(s, -1) @ v                    (per batch, per query head)
// Requirements: NH % NKV == 0; buffers do not alias; positions arrays have Tq / Tk entries.
// Guarantees:
//   - Computed per (batch, head) over blocks of queries with GEMMs (S = Q_blk Kᵀ, then P V);
//     a block only multiplies the key prefix up to the last key visible to any query in it, so
//     sorted key positions (the usual case) skip the masked upper triangle.
//   - forward writes lse[b, h, i] = logsumexp_j visible s[i, j] (the softmax statistic backward
//     reuses instead of storing the T x T probabilities, as in FlashAttention).
//   - A query that sees no key gets out = 0, lse = -inf, and contributes no gradient.
//   - backward overwrites dq (local queries) and dk, dv (all Tk keys).
// Cost: ~4 * B * NH * hs * (visible pairs) flops forward, 2.5x that backward (S is recomputed).
#pragma once

#include <cstdint>

namespace tspemu::ref {

struct AttentionDims {
  int B = 0;    // batch
  int Tq = 0;   // queries per sequence (this rank's tokens)
  int Tk = 0;   // keys per sequence (e.g. the full gathered sequence)
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

// dS = P ∘ (dP - rowsum(P ∘ dP)), dP = dout Vᵀ;  dq = dS K / sqrt(hs);  dk = dSᵀ Q / sqrt(hs);
// dv = Pᵀ dout.
template <class T>
void causal_attention_backward(T* dq,          // [B, Tq, NH, hs], overwritten
                               T* dk,          // [B, Tk, NKV, hs], overwritten
                               T* dv,          // [B, Tk, NKV, hs], overwritten
                               const T* dout,  // [B, Tq, NH, hs]
                               const T* q, const T* k, const T* v,
                               const T* lse,  // [B, NH, Tq], from forward
                               const std::int64_t* q_positions, const std::int64_t* k_positions,
                               const AttentionDims& d);

}  // namespace tspemu::ref
