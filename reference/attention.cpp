#include "tspemu/reference/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "oracle_tasks.hpp"
#include "tspemu/core/compute_span.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/exp_poly.hpp"
#include "tspemu/reference/matmul.hpp"
#include "wide_clones.hpp"

namespace tspemu::ref {

namespace {

// Queries per GEMM block: large enough for BLAS efficiency, small enough that the masked part of
// the key prefix (about kQueryBlock/2 keys per row) stays a few percent of the work at T ~ 2K.
constexpr int kQueryBlock = 128;
// Query rows per step of the forward: two query blocks, whose keys up to the shorter block's
// prefix are one GEMM of 256 rows. (Not the backward: its per-block products and scratch,
// 2 x rows x keys, ran slower at 256 rows.) The attention products have K = hs (scores) and N
// = hs (P·V), so each operand's packing is amortized over few rows or columns: 256 rows run
// faster than 128, with the masked work of 128 (figures: docs/benchmarks.md).
constexpr int kForwardRows = 2 * kQueryBlock;

void check_dims(const char* op, const AttentionDims& d) {
  if (d.B < 0 || d.Tq < 0 || d.Tk < 0 || d.NH <= 0 || d.NKV <= 0 || d.hs <= 0 ||
      d.NH % d.NKV != 0) {
    throw std::invalid_argument(std::string(op) + ": bad dims B=" + std::to_string(d.B) +
                                " Tq=" + std::to_string(d.Tq) + " Tk=" + std::to_string(d.Tk) +
                                " NH=" + std::to_string(d.NH) + " NKV=" + std::to_string(d.NKV) +
                                " hs=" + std::to_string(d.hs) +
                                " (need B, Tq, Tk >= 0; NH, NKV, hs > 0; NH % NKV == 0)");
  }
}

// Number of leading keys a query block needs: one past the last key visible to any of its
// queries (0 if none). Keys after it are masked for every query in the block.
int key_prefix(const std::int64_t* q_pos, int i0, int i1, const std::int64_t* k_pos, int Tk) {
  const std::int64_t max_q = *std::max_element(q_pos + i0, q_pos + i1);
  int end = 0;
  for (int j = 0; j < Tk; ++j) {
    if (k_pos[j] <= max_q) end = j + 1;
  }
  return end;
}

// Pointers to the head's first row; rows are ld = heads*hs apart.
struct HeadView {
  std::size_t q_off, k_off;  // element offsets of (b, row 0, head)
  int ldq, ldk;
};

// Per-call scratch: the fp32 reference's tasks run in order on one thread and share one buffer;
// the oracle's tasks may run concurrently, so each has its own.
template <class T>
class Scratch {
 public:
  explicit Scratch(std::size_t n) : shared_(std::is_same_v<T, double> ? 0 : n) {}
  T* for_task(std::vector<T>& own, std::size_t n) {
    if (!shared_.empty()) return shared_.data();
    own.resize(n);
    return own.data();
  }

 private:
  std::vector<T> shared_;
};

HeadView head_view(const AttentionDims& d, int b, int h) {
  const int group = d.NH / d.NKV;
  const int g = h / group;  // the K/V head this query head reads
  return {(std::size_t(b) * d.Tq * d.NH + h) * d.hs, (std::size_t(b) * d.Tk * d.NKV + g) * d.hs,
          d.NH * d.hs, d.NKV * d.hs};
}

// Multiply-adds of one score GEMM (Q_blk · K_prefixᵀ) summed over every (batch, head, query
// block): the unit of both kernels' GEMM work, for their ComputeSpans. Only computed when a trace
// or a simulated clock observes the thread.
double score_gemm_macs(const std::int64_t* q_pos, const std::int64_t* k_pos,
                       const AttentionDims& d) {
  double macs = 0;
  for (int i0 = 0; i0 < d.Tq; i0 += kQueryBlock) {
    const int i1 = std::min(i0 + kQueryBlock, d.Tq);
    macs += double(i1 - i0) * key_prefix(q_pos, i0, i1, k_pos, d.Tk);
  }
  return macs * d.B * d.NH * d.hs;
}

// In a dry run the positions are unbacked: half of every query's keys visible, the causal average
// (exact for the whole sequence, and for a zigzag rank's balanced share of it).
double dry_score_gemm_macs(const AttentionDims& d) {
  return 0.5 * d.Tq * static_cast<double>(d.Tk) * d.B * d.NH * d.hs;
}

// ---- fp32 rows with ascending key positions ------------------------------------------------
// With ascending key positions, the keys visible to a query are a prefix of the row, so masking
// is a length and the row's exps, max and sums run on vector lanes (exp_poly). The double
// oracle, and keys in any other order, take the per-element loops (std::exp, index-order sums).

// Keys visible to a query at position qp among the first kend (ascending) key positions.
int visible_prefix(const std::int64_t* k_pos, int kend, std::int64_t qp) {
  return static_cast<int>(std::upper_bound(k_pos, k_pos + kend, qp) - k_pos);
}

// row[0, n) = exp(row * a - b), returning their sum: sixteen lane partial sums, each in index
// order, then a fixed pairwise tree. The softmax rows' hot loop (one exp per visible score).
TSPEMU_WIDE_CLONES float exp_row(float* row, int n, float a, float b) {
  f32x16 acc{};
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    f32x16 e;
    std::memcpy(&e, row + j, sizeof e);
    e = e * a - b;
    exp_poly_in_place(e);
    std::memcpy(row + j, &e, sizeof e);
    acc += e;
  }
  if (j < n) {
    // The tail through the same code, padded with -inf: exp gives 0, leaving acc unchanged.
    f32x16 e = f32x16{} - std::numeric_limits<float>::infinity();
    std::memcpy(&e, row + j, std::size_t(n - j) * sizeof(float));
    e = e * a - b;
    exp_poly_in_place(e);
    std::memcpy(row + j, &e, std::size_t(n - j) * sizeof(float));
    acc += e;
  }
  return tree_sum(acc);
}

// max(row[0, n) * scale), -inf for n = 0. The max is order-independent, so the lanes give exactly
// the per-element loop's value; a NaN is never selected (as std::max(m, NaN) keeps m).
TSPEMU_WIDE_CLONES float scaled_max(const float* row, int n, float scale) {
  using i32x16 = std::int32_t __attribute__((vector_size(64)));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  f32x16 mx = f32x16{} + neg_inf;
  for (int j = 0; j < n; j += 16) {
    // The tail through the same code, padded with -inf (never above the running max).
    f32x16 x = f32x16{} + neg_inf;
    if (j + 16 <= n)
      std::memcpy(&x, row + j, sizeof x);  // fixed size: one vector load
    else
      std::memcpy(&x, row + j, std::size_t(n - j) * sizeof(float));
    x = x * scale;
    const i32x16 above = x > mx;
    mx = (f32x16)(((i32x16)x & above) | ((i32x16)mx & ~above));
  }
  float lanes[16];
  std::memcpy(lanes, &mx, sizeof lanes);
  float m = neg_inf;
  for (const float l : lanes) m = std::max(m, l);
  return m;
}

// Forward: row[0, nvis) = exp(row * scale - max), row[nvis, kend) = 0, the softmax's numerators;
// *inv = 1 / their sum, applied by the caller to the row's output (bq x hs) instead of to the
// row (bq x kend). Returns the logsumexp of the scaled row (-inf, with a zero row and *inv = 0,
// when no key is visible).
float softmax_prefix_row(float* row, int nvis, int kend, float scale, float* inv) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float m = scaled_max(row, nvis, scale);
  if (m == neg_inf) {  // no visible key
    std::fill_n(row, kend, 0.0f);
    *inv = 0.0f;
    return neg_inf;
  }
  const float sum = exp_row(row, nvis, scale, m);
  std::fill(row + nvis, row + kend, 0.0f);
  *inv = 1.0f / sum;
  return m + std::log(sum);
}

// Backward, before dv: p[0, nvis) = exp(s · scale - lse) (the forward's probabilities from its
// saved lse), p[nvis, kend) = 0.
void probabilities_prefix_row(float* p, int nvis, int kend, float scale, float lse) {
  if (lse == -std::numeric_limits<float>::infinity()) nvis = 0;  // the query saw no key
  exp_row(p, nvis, scale, lse);
  std::fill(p + nvis, p + kend, 0.0f);
}

// Backward, after dv: p = dS = p ∘ (dp - delta) · scale, delta the caller's or (nullptr)
// rowsum(p ∘ dp) over this call's keys (p is 0 past nvis): sixteen lane partial sums, each in
// index order, then a fixed pairwise tree (as exp_row).
TSPEMU_WIDE_CLONES void softmax_grad_prefix_row(float* p, const float* dp, int nvis, int kend,
                                                float scale, const float* delta) {
  float dot = 0;
  if (delta) {
    dot = *delta;
  } else {
    f32x16 acc{};
    for (int j = 0; j < nvis; j += 16) {
      f32x16 x{}, y{};  // the tail padded with zeros: adds +0 to no lane that was not +0
      if (j + 16 <= nvis) {
        std::memcpy(&x, p + j, sizeof x);  // fixed size: one vector load
        std::memcpy(&y, dp + j, sizeof y);
      } else {
        std::memcpy(&x, p + j, std::size_t(nvis - j) * sizeof(float));
        std::memcpy(&y, dp + j, std::size_t(nvis - j) * sizeof(float));
      }
      acc += x * y;
    }
    dot = tree_sum(acc);
  }
  int j = 0;
  for (; j + 16 <= kend; j += 16) {
    f32x16 x, y;
    std::memcpy(&x, p + j, sizeof x);
    std::memcpy(&y, dp + j, sizeof y);
    x = x * (y - dot) * scale;
    std::memcpy(p + j, &x, sizeof x);
  }
  for (; j < kend; ++j) p[j] = p[j] * (dp[j] - dot) * scale;
}

}  // namespace

template <class T>
void causal_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                              const std::int64_t* q_positions, const std::int64_t* k_positions,
                              const AttentionDims& d) {
  check_dims("causal_attention_forward", d);
  // Two GEMMs per block (S = Q Kᵀ, O = P V).
  ComputeSpan span("attention");
  if (dry_run()) {
    span.set_flops(2 * 2 * dry_score_gemm_macs(d));
    return;
  }
  if (span.observed() && d.Tq > 0)
    span.set_flops(2 * 2 * score_gemm_macs(q_positions, k_positions, d));
  const T scale = T(1.0 / std::sqrt(double(d.hs)));
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const bool keys_ascending = std::is_sorted(k_positions, k_positions + d.Tk);
  const std::size_t scratch = std::size_t(kForwardRows) * std::max(d.Tk, 1);
  Scratch<T> serial(scratch);
  // One task per (batch, head): it alone writes that head's rows of out and lse.
  detail::for_each_task<T>(d.B * d.NH, [&](int task) {
    const int b = task / d.NH, h = task % d.NH;
    const HeadView hv = head_view(d, b, h);
    std::vector<T> own;
    T* s = serial.for_task(own, scratch);      // [bq, kend] scores -> probs
    [[maybe_unused]] T row_inv[kForwardRows];  // fp32 prefix rows: 1 / each row's exp sum
    {
      // Two query blocks per step (see kForwardRows): rows [0, half) need the keys [0, kend_lo),
      // rows [half, bq) the keys [0, kend_hi); the keys [0, common) both need are one GEMM of bq
      // rows, the rest of the longer prefix one of its block's rows.
      for (int i0 = 0; i0 < d.Tq; i0 += kForwardRows) {
        const int i1 = std::min(i0 + kForwardRows, d.Tq), bq = i1 - i0;
        const int half = std::min(kQueryBlock, bq);
        const int kend_lo = key_prefix(q_positions, i0, i0 + half, k_positions, d.Tk);
        const int kend_hi =
            half < bq ? key_prefix(q_positions, i0 + half, i1, k_positions, d.Tk) : kend_lo;
        const int kend = std::max(kend_lo, kend_hi), common = std::min(kend_lo, kend_hi);
        // The block (rows [r0, r0 + rows)) whose prefix is longer, if any.
        const int r0 = kend_hi > kend_lo ? half : 0, rows = kend_hi > kend_lo ? bq - half : half;
        const T* q_blk = q + hv.q_off + std::size_t(i0) * hv.ldq;    // [bq, hs], ld = NH*hs
        T* o_blk = out + hv.q_off + std::size_t(i0) * hv.ldq;        // [bq, hs], ld = NH*hs
        T* lse_blk = lse + (std::size_t(b) * d.NH + h) * d.Tq + i0;  // [bq]
        if (kend == 0) {
          for (int i = 0; i < bq; ++i) {
            std::fill_n(o_blk + std::size_t(i) * hv.ldq, d.hs, T(0));
            lse_blk[i] = neg_inf;
          }
          continue;
        }
        // s[:, :common] = q_blk @ k[:common].T ;  s[r0:r0+rows, common:kend] = q[r0:] @
        // k[common:kend].T
        matmul_nt(s, q_blk, k + hv.k_off, bq, common, d.hs, false, hv.ldq, hv.ldk, kend);
        if (kend > common)
          matmul_nt(s + std::size_t(r0) * kend + common, q_blk + std::size_t(r0) * hv.ldq,
                    k + hv.k_off + std::size_t(common) * hv.ldk, rows, kend - common, d.hs, false,
                    hv.ldq, hv.ldk, kend);
        for (int i = 0; i < bq; ++i) {
          T* row = s + std::size_t(i) * kend;
          const int row_end = i < half ? kend_lo : kend_hi;  // this row's keys: [0, row_end)
          const std::int64_t qp = q_positions[i0 + i];
          if constexpr (std::is_same_v<T, float>) {
            if (keys_ascending) {
              lse_blk[i] = softmax_prefix_row(row, visible_prefix(k_positions, row_end, qp),
                                              row_end, scale, &row_inv[i]);
              continue;
            }
          }
          T m = neg_inf;
          for (int j = 0; j < row_end; ++j) {
            row[j] = k_positions[j] <= qp ? row[j] * scale : neg_inf;
            m = std::max(m, row[j]);
          }
          if (m == neg_inf) {  // this query sees no key
            std::fill_n(row, row_end, T(0));
            lse_blk[i] = neg_inf;
            continue;
          }
          T sum = 0;
          for (int j = 0; j < row_end; ++j) {
            row[j] = std::exp(row[j] - m);  // exp(-inf) = 0 for masked keys
            sum += row[j];
          }
          const T inv = T(1) / sum;
          for (int j = 0; j < row_end; ++j) row[j] *= inv;
          lse_blk[i] = m + std::log(sum);
        }
        // out_blk = p[:, :common] @ v[:common] ;  out[r0:r0+rows] += p[r0:, common:kend] @
        // v[common:kend]
        matmul_nn(o_blk, s, v + hv.k_off, bq, d.hs, common, false, kend, hv.ldk, hv.ldq);
        if (kend > common)
          matmul_nn(o_blk + std::size_t(r0) * hv.ldq, s + std::size_t(r0) * kend + common,
                    v + hv.k_off + std::size_t(common) * hv.ldk, rows, d.hs, kend - common, true,
                    kend, hv.ldk, hv.ldq);
        if constexpr (std::is_same_v<T, float>) {
          if (keys_ascending) {
            for (int i = 0; i < bq; ++i)
              for (int c = 0; c < d.hs; ++c) o_blk[std::size_t(i) * hv.ldq + c] *= row_inv[i];
          }
        }
      }
    }
  });
}

template <class T>
void causal_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                               const T* v, const T* lse, const std::int64_t* q_positions,
                               const std::int64_t* k_positions, const AttentionDims& d,
                               const T* delta, bool accumulate) {
  check_dims("causal_attention_backward", d);
  // Five GEMMs per block (S recomputed, dP = dO Vᵀ, dQ, dK, dV).
  ComputeSpan span("attention backward");
  if (dry_run()) {
    span.set_flops(5 * 2 * dry_score_gemm_macs(d));
    return;
  }
  if (span.observed() && d.Tq > 0)
    span.set_flops(5 * 2 * score_gemm_macs(q_positions, k_positions, d));
  const T scale = T(1.0 / std::sqrt(double(d.hs)));
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const bool keys_ascending = std::is_sorted(k_positions, k_positions + d.Tk);
  if (!accumulate) {
    const std::size_t kv_elems = std::size_t(d.B) * d.Tk * d.NKV * d.hs;
    std::fill_n(dk, kv_elems, T(0));
    std::fill_n(dv, kv_elems, T(0));
  }
  const std::size_t scratch = std::size_t(kQueryBlock) * std::max(d.Tk, 1);
  Scratch<T> serial(2 * scratch);
  // One task per (batch, K/V head): it alone writes that K/V head's dk, dv (accumulated over its
  // query heads in ascending order, as a one-thread run does) and its query heads' dq.
  const int group = d.NH / d.NKV;
  detail::for_each_task<T>(d.B * d.NKV, [&](int task) {
    const int b = task / d.NKV, g = task % d.NKV;
    std::vector<T> own;
    T* const p = serial.for_task(own, 2 * scratch);  // [bq, kend] probs -> dS
    T* const dp = p + scratch;                       // [bq, kend]
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const HeadView hv = head_view(d, b, h);
      for (int i0 = 0; i0 < d.Tq; i0 += kQueryBlock) {
        const int i1 = std::min(i0 + kQueryBlock, d.Tq), bq = i1 - i0;
        const int kend = key_prefix(q_positions, i0, i1, k_positions, d.Tk);
        const T* q_blk = q + hv.q_off + std::size_t(i0) * hv.ldq;
        const T* do_blk = dout + hv.q_off + std::size_t(i0) * hv.ldq;
        T* dq_blk = dq + hv.q_off + std::size_t(i0) * hv.ldq;
        const std::size_t row0 = (std::size_t(b) * d.NH + h) * d.Tq + i0;
        const T* lse_blk = lse + row0;
        const T* delta_blk = delta ? delta + row0 : nullptr;
        if (kend == 0) {
          if (accumulate) continue;
          for (int i = 0; i < bq; ++i) std::fill_n(dq_blk + std::size_t(i) * hv.ldq, d.hs, T(0));
          continue;
        }
        // Recompute p = softmax(s) from the saved logsumexp rather than storing T x T probs.
        matmul_nt(p, q_blk, k + hv.k_off, bq, kend, d.hs, false, hv.ldq, hv.ldk, kend);
        // dp = dout_blk @ v[:kend].T
        matmul_nt(dp, do_blk, v + hv.k_off, bq, kend, d.hs, false, hv.ldq, hv.ldk, kend);
        for (int i = 0; i < bq; ++i) {
          T* prow = p + std::size_t(i) * kend;
          const std::int64_t qp = q_positions[i0 + i];
          const T l = lse_blk[i];
          if constexpr (std::is_same_v<T, float>) {
            if (keys_ascending) {
              probabilities_prefix_row(prow, visible_prefix(k_positions, kend, qp), kend, scale, l);
              continue;
            }
          }
          for (int j = 0; j < kend; ++j) {
            const bool visible = k_positions[j] <= qp && l != neg_inf;
            prow[j] = visible ? std::exp(prow[j] * scale - l) : T(0);
          }
        }
        // dv[:kend] += p.T @ dout_blk
        matmul_tn(dv + hv.k_off, p, do_blk, kend, d.hs, bq, true, kend, hv.ldq, hv.ldk);
        // dS = p * (dp - rowsum(p * dp)) * scale, written over p. With blocks of keys, the rowsum
        // must run over all keys, which only the caller's delta (dout . out) knows.
        for (int i = 0; i < bq; ++i) {
          T* prow = p + std::size_t(i) * kend;
          const T* dprow = dp + std::size_t(i) * kend;
          if constexpr (std::is_same_v<T, float>) {
            if (keys_ascending) {
              softmax_grad_prefix_row(prow, dprow,
                                      visible_prefix(k_positions, kend, q_positions[i0 + i]), kend,
                                      scale, delta_blk ? delta_blk + i : nullptr);
              continue;
            }
          }
          T dot = 0;
          if (delta_blk) {
            dot = delta_blk[i];
          } else {
            for (int j = 0; j < kend; ++j) dot += prow[j] * dprow[j];
          }
          for (int j = 0; j < kend; ++j) prow[j] = prow[j] * (dprow[j] - dot) * scale;
        }
        // dq_blk = dS @ k[:kend];  dk[:kend] += dS.T @ q_blk
        matmul_nn(dq_blk, p, k + hv.k_off, bq, d.hs, kend, accumulate, kend, hv.ldk, hv.ldq);
        matmul_tn(dk + hv.k_off, p, q_blk, kend, d.hs, bq, true, kend, hv.ldq, hv.ldk);
      }
    }
  });
}

template <class T>
void attention_row_delta(T* delta, const T* dout, const T* out, const AttentionDims& d) {
  check_dims("attention_row_delta", d);
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (int b = 0; b < d.B; ++b) {
    for (int h = 0; h < d.NH; ++h) {
      for (int i = 0; i < d.Tq; ++i) {
        const std::size_t off = ((std::size_t(b) * d.Tq + i) * d.NH + h) * d.hs;
        T dot = 0;
        for (int c = 0; c < d.hs; ++c) dot += dout[off + c] * out[off + c];
        delta[(std::size_t(b) * d.NH + h) * d.Tq + i] = dot;
      }
    }
  }
}

template <class T>
void merge_attention_partials(T* out, T* lse, const T* part_out, const T* part_lse,
                              const AttentionDims& d) {
  check_dims("merge_attention_partials", d);
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int b = 0; b < d.B; ++b) {
    for (int h = 0; h < d.NH; ++h) {
      for (int i = 0; i < d.Tq; ++i) {
        const std::size_t r = (std::size_t(b) * d.NH + h) * d.Tq + i;
        const std::size_t off = ((std::size_t(b) * d.Tq + i) * d.NH + h) * d.hs;
        T* o = out + off;              // [hs]
        const T* po = part_out + off;  // [hs]
        const T l = lse[r], pl = part_lse[r];
        if (pl == neg_inf) continue;  // the block had no key visible to this query
        // Nothing seen yet: take the partial as is (the formula's 0 * out would be NaN for an
        // uninitialised out holding inf).
        if (l == neg_inf) {
          std::copy_n(po, d.hs, o);
          lse[r] = pl;
          continue;
        }
        // logaddexp without overflow: max + log1p(exp(min - max)).
        const T m = std::max(l, pl);
        const T merged = m + std::log1p(std::exp(std::min(l, pl) - m));
        const T a = std::exp(l - merged), pa = std::exp(pl - merged);
        for (int c = 0; c < d.hs; ++c) o[c] = o[c] * a + po[c] * pa;
        lse[r] = merged;
      }
    }
  }
}

#define TSPEMU_INSTANTIATE(T)                                                                    \
  template void causal_attention_forward<T>(T*, T*, const T*, const T*, const T*,                \
                                            const std::int64_t*, const std::int64_t*,            \
                                            const AttentionDims&);                               \
  template void causal_attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, \
                                             const T*, const std::int64_t*, const std::int64_t*, \
                                             const AttentionDims&, const T*, bool);              \
  template void attention_row_delta<T>(T*, const T*, const T*, const AttentionDims&);            \
  template void merge_attention_partials<T>(T*, T*, const T*, const T*, const AttentionDims&);
TSPEMU_INSTANTIATE(float)
TSPEMU_INSTANTIATE(double)
#undef TSPEMU_INSTANTIATE

}  // namespace tspemu::ref
