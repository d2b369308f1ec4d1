// Single-rank ring attention for the reference tests: the keys split into blocks, each block
// attended on its own, the partials merged by their logsumexp, and the backward run block by
// block on the merged statistics. It is what a ring schedule computes, without the ring.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "tspemu/reference/attention.hpp"

namespace tspemu::ref::testing {

// Tokens [0, T) in storage order, cut into n contiguous ranges (sizes differ by at most one).
inline std::vector<std::vector<int>> contiguous_blocks(int T, int n) {
  std::vector<std::vector<int>> blocks(n);
  for (int b = 0; b < n; ++b) {
    for (int t = T * b / n; t < T * (b + 1) / n; ++t) blocks[b].push_back(t);
  }
  return blocks;
}

// Global positions of a sequence stored in the zigzag layout over D ranks: storage holds rank 0's
// chunks [C_0, C_{2D-1}], then rank 1's [C_1, C_{2D-2}], ... (TSP-NOTES.md). T % (2D) == 0.
inline std::vector<std::int64_t> zigzag_positions(int T, int D) {
  const int chunk = T / (2 * D);
  std::vector<std::int64_t> pos;
  for (int r = 0; r < D; ++r) {
    for (int i = 0; i < chunk; ++i) pos.push_back(std::int64_t(r) * chunk + i);
    for (int i = 0; i < chunk; ++i) pos.push_back(std::int64_t(2 * D - 1 - r) * chunk + i);
  }
  return pos;
}

inline std::vector<std::int64_t> iota_positions(int T) {
  std::vector<std::int64_t> pos(T);
  for (int t = 0; t < T; ++t) pos[t] = t;
  return pos;
}

// rows idx of x [B, T, row] -> [B, |idx|, row]
template <class T>
std::vector<T> gather_rows(const T* x, int B, int Tfull, int row, const std::vector<int>& idx) {
  const int n = int(idx.size());
  std::vector<T> out(std::size_t(B) * n * row);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < n; ++i) {
      std::copy_n(x + (std::size_t(b) * Tfull + idx[i]) * row, row,
                  out.data() + (std::size_t(b) * n + i) * row);
    }
  }
  return out;
}

// x [B, |idx|, row] -> rows idx of dst [B, T, row]
template <class T>
void scatter_rows(T* dst, const std::vector<T>& x, int B, int Tfull, int row,
                  const std::vector<int>& idx) {
  const int n = int(idx.size());
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < n; ++i) {
      std::copy_n(x.data() + (std::size_t(b) * n + i) * row, row,
                  dst + (std::size_t(b) * Tfull + idx[i]) * row);
    }
  }
}

// One key block cut out of the full K/V: its rows, positions and dims (Tk = its length).
template <class T>
struct KeyBlock {
  std::vector<T> k, v;                  // [B, Tb, NKV, hs]
  std::vector<std::int64_t> positions;  // [Tb]
  AttentionDims dims;

  KeyBlock(const T* k_all, const T* v_all, const std::int64_t* k_pos, const AttentionDims& d,
           const std::vector<int>& idx)
      : k(gather_rows(k_all, d.B, d.Tk, d.NKV * d.hs, idx)),
        v(gather_rows(v_all, d.B, d.Tk, d.NKV * d.hs, idx)),
        dims(d) {
    for (int j : idx) positions.push_back(k_pos[j]);
    dims.Tk = int(idx.size());
  }
};

// Attention of all Tq queries on the union of the key blocks (indices into the d.Tk keys):
// out [B, Tq, NH, hs], lse [B, NH, Tq] overwritten.
template <class T>
void blockwise_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                                 const std::int64_t* q_pos, const std::int64_t* k_pos,
                                 const AttentionDims& d,
                                 const std::vector<std::vector<int>>& blocks) {
  const std::size_t out_n = std::size_t(d.B) * d.Tq * d.NH * d.hs,
                    lse_n = std::size_t(d.B) * d.NH * d.Tq;
  std::fill_n(out, out_n, T(0));
  std::fill_n(lse, lse_n, -std::numeric_limits<T>::infinity());
  std::vector<T> part(out_n), part_lse(lse_n);
  for (const auto& idx : blocks) {
    const KeyBlock<T> kb(k, v, k_pos, d, idx);
    causal_attention_forward(part.data(), part_lse.data(), q, kb.k.data(), kb.v.data(), q_pos,
                             kb.positions.data(), kb.dims);
    merge_attention_partials(out, lse, part.data(), part_lse.data(), d);
  }
}

// Backward of blockwise_attention_forward from its merged out and lse: dq accumulated over the
// blocks, each block's dk, dv final and scattered to its keys. All three overwritten.
template <class T>
void blockwise_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                                  const T* v, const T* out, const T* lse, const std::int64_t* q_pos,
                                  const std::int64_t* k_pos, const AttentionDims& d,
                                  const std::vector<std::vector<int>>& blocks) {
  std::vector<T> delta(std::size_t(d.B) * d.NH * d.Tq);  // [B, NH, Tq]
  attention_row_delta(delta.data(), dout, out, d);
  std::fill_n(dq, std::size_t(d.B) * d.Tq * d.NH * d.hs, T(0));
  const int kv_row = d.NKV * d.hs;
  for (const auto& idx : blocks) {
    const KeyBlock<T> kb(k, v, k_pos, d, idx);
    // dq sums over the blocks; this block's dk, dv start at zero and are final after the call.
    std::vector<T> dkb(kb.k.size(), T(0)), dvb(kb.v.size(), T(0));
    causal_attention_backward(dq, dkb.data(), dvb.data(), dout, q, kb.k.data(), kb.v.data(), lse,
                              q_pos, kb.positions.data(), kb.dims, delta.data(),
                              /*accumulate=*/true);
    scatter_rows(dk, dkb, d.B, d.Tk, kv_row, idx);
    scatter_rows(dv, dvb, d.B, d.Tk, kv_row, idx);
  }
}

}  // namespace tspemu::ref::testing
