// MeshRegion (private to tspemu::tsp): the entry and exit of the tensor-parallel region of a
// baseline block on a T × Sp mesh (baseline_shape.hpp), shared by BaselineAttention and
// BaselineMlp — Megatron's conjugate operators f (enter) and g (exit), and their adjoints.
//
//   TP (tokens replicated over the row):
//     forward  enter: norm(x)                         exit: all_reduce(tp) of the partial output
//     backward enter: dy as is                        exit: all_reduce(tp) of dN
//   Megatron-SP (each rank of the row holds a contiguous piece of the row's tokens):
//     forward  enter: norm(piece), all_gather(tp)     exit: reduce_scatter(tp)
//     backward enter: all_gather(tp) of dy            exit: reduce_scatter(tp) of dN
// All-gathered pieces are reordered from rank-major [T][B, Tl/T, C] into [B, Tl, C], and the
// reduce-scatter input into rank-major, with piece_layout(). Collectives over one rank are skipped.
// Gradient reductions (rank order, deterministic):
//   weight shards: partial per row's tokens → all_reduce over the column (SP group), if Sp > 1;
//   norm weight: without sequence_parallel the row's T ranks see the same tokens and the same
//     reduced dN, so their norm gradients are already bitwise equal: only the SP group
//     all-reduces; with sequence_parallel every rank holds a different piece → all_reduce over all.
#pragma once

#include <cstring>
#include <functional>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"

namespace tspemu::tsp::detail {

class MeshRegion {
 public:
  MeshRegion(Rank& rank, const BaselineShape& s)
      : rank_(rank),
        s_(s),
        tp_(rank.comm().split(s.row(rank.id()), s.col(rank.id()), "tp")),
        sp_(rank.comm().split(s.col(rank.id()), s.row(rank.id()), "sp")) {}

  Comm& tp() { return tp_; }
  Comm& sp() { return sp_; }
  std::size_t full_elems() const {
    return static_cast<std::size_t>(s_.B) * s_.Tl() * s_.model.hidden;
  }
  std::size_t local_elems() const {
    return static_cast<std::size_t>(s_.B) * s_.rows() * s_.model.hidden;
  }

  // xn [B·Tl, C] = the row's normed tokens; rstd [B·rows] of this rank's input rows.
  void enter(const float* x, const float* norm_w, float* xn, float* rstd) {
    const int C = s_.model.hidden, n = s_.B * s_.rows();
    if (!s_.sequence_parallel) {
      ref::rmsnorm_forward(xn, rstd, x, norm_w, n, C, s_.model.norm_eps);
      return;
    }
    Arena& a = rank_.arena();
    auto piece = a.allocate<float>(local_elems(), Category::workspace);
    ref::rmsnorm_forward(piece.data(), rstd, x, norm_w, n, C, s_.model.norm_eps);
    gather_pieces(piece.data(), xn);
  }

  // y = x + the row's sum of every rank's partial output; `project(out, accumulate)` writes this
  // rank's partial row-parallel product [B·Tl, C] into out.
  void exit(const float* x, float* y, const std::function<void(float*, bool)>& project) {
    const std::size_t local = local_elems();
    if (s_.T == 1) {  // no reduction: accumulate straight onto the residual, like the reference
      if (!dry_run()) std::memcpy(y, x, local * sizeof(float));
      project(y, true);
      return;
    }
    Arena& a = rank_.arena();
    auto partial = a.allocate<float>(full_elems(), Category::workspace);
    project(partial.data(), false);
    const float* sum = partial.data();
    Buffer<float> mine;
    if (s_.sequence_parallel) {
      mine = a.allocate<float>(local, Category::comm);
      scatter_pieces(partial.data(), mine.data());
      sum = mine.data();
    } else {
      all_reduce<float>(tp_, partial.span());
    }
    if (!dry_run())
      for (std::size_t i = 0; i < local; ++i) y[i] = x[i] + sum[i];
  }

  // dY of the row's Tl tokens: dy itself, or all-gathered into `storage` under sequence_parallel.
  const float* enter_backward(const float* dy, Buffer<float>& storage) {
    if (!s_.sequence_parallel) return dy;
    storage = rank_.arena().allocate<float>(full_elems(), Category::workspace);
    gather_pieces(dy, storage.data());
    return storage.data();
  }

  // dxn [B·Tl, C]: this rank's partial gradient of the normed tokens (from its shard's GEMMs),
  // overwritten. dx = norm_backward(reduced dxn) + dy (residual); grad_norm overwritten and
  // reduced as described above.
  void exit_backward(float* dxn, const float* x, const float* dy, const float* norm_w,
                     const float* rstd, float* dx, Buffer<float>& grad_norm) {
    const int C = s_.model.hidden, n = s_.B * s_.rows();
    const std::size_t local = local_elems();
    const float* g = dxn;
    Buffer<float> mine;
    if (s_.T > 1) {
      if (s_.sequence_parallel) {
        mine = rank_.arena().allocate<float>(local, Category::comm);
        scatter_pieces(dxn, mine.data());
        g = mine.data();
      } else {
        all_reduce<float>(tp_, std::span<float>(dxn, full_elems()));
      }
    }
    if (!dry_run()) std::memset(grad_norm.data(), 0, grad_norm.size() * sizeof(float));
    ref::rmsnorm_backward(dx, grad_norm.data(), g, x, norm_w, rstd, n, C);
    if (!dry_run())
      for (std::size_t i = 0; i < local; ++i) dx[i] += dy[i];  // residual
    if (s_.sequence_parallel) {
      if (s_.ranks() > 1) all_reduce<float>(rank_.comm(), grad_norm.span());
    } else if (s_.Sp > 1) {
      all_reduce<float>(sp_, grad_norm.span());
    }
  }

  void reduce_weight_grads(Buffer<float>& grad) {
    if (s_.Sp > 1) all_reduce<float>(sp_, grad.span());
  }

  // piece [B, Tl/T, C] of every rank of the row → full [B, Tl, C]
  void gather_pieces(const float* piece, float* full) {
    const std::size_t local = local_elems();
    auto gathered = rank_.arena().allocate<float>(local * s_.T, Category::comm);
    all_gather<float>(tp_, std::span<const float>(piece, local), gathered.span());
    const SequenceLayout pl = s_.piece_layout();
    for (int q = 0; q < s_.T; ++q)
      pl.gather(gathered.data() + q * local, full, q, s_.B, s_.model.hidden);
  }
  // full [B, Tl, C] partials of every rank → this rank's piece of their sum
  void scatter_pieces(const float* full, float* piece) {
    const std::size_t local = local_elems();
    auto send = rank_.arena().allocate<float>(local * s_.T, Category::comm);
    const SequenceLayout pl = s_.piece_layout();
    for (int q = 0; q < s_.T; ++q)
      pl.scatter(full, send.data() + q * local, q, s_.B, s_.model.hidden);
    reduce_scatter<float>(tp_, std::span<const float>(send.data(), send.size()),
                          std::span<float>(piece, local));
  }

 private:
  Rank& rank_;
  BaselineShape s_;
  Comm tp_;  // this rank's row: the TP group, ranked by column
  Comm sp_;  // this rank's column: the SP group, ranked by row
};

// K/V of one head shard, gathered over the SP group rank-major [Sp][2][B·Tl, kc] (K then V of
// each row), to and from [B, S, kc] each in global position order (layout: row_layout()).
inline void kv_order_by_position(const SequenceLayout& layout, int B, int kc, const float* gathered,
                                 float* k_all, float* v_all) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  const int Tl = layout.local_tokens(), S = layout.seq_len();
  const std::size_t row = static_cast<std::size_t>(kc);
  const std::size_t block = static_cast<std::size_t>(B) * Tl * row;
  for (int q = 0; q < layout.ranks(); ++q)
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < Tl; ++i) {
        const std::size_t src =
            static_cast<std::size_t>(q) * 2 * block + (static_cast<std::size_t>(b) * Tl + i) * row;
        const std::size_t dst = (static_cast<std::size_t>(b) * S + layout.position(q, i)) * row;
        std::memcpy(k_all + dst, gathered + src, row * sizeof(float));
        std::memcpy(v_all + dst, gathered + src + block, row * sizeof(float));
      }
}

inline void kv_order_by_rank(const SequenceLayout& layout, int B, int kc, const float* dk_all,
                             const float* dv_all, float* scattered) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  const int Tl = layout.local_tokens(), S = layout.seq_len();
  const std::size_t row = static_cast<std::size_t>(kc);
  const std::size_t block = static_cast<std::size_t>(B) * Tl * row;
  for (int q = 0; q < layout.ranks(); ++q)
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < Tl; ++i) {
        const std::size_t dst =
            static_cast<std::size_t>(q) * 2 * block + (static_cast<std::size_t>(b) * Tl + i) * row;
        const std::size_t src = (static_cast<std::size_t>(b) * S + layout.position(q, i)) * row;
        std::memcpy(scattered + dst, dk_all + src, row * sizeof(float));
        std::memcpy(scattered + dst + block, dv_all + src, row * sizeof(float));
      }
}

}  // namespace tspemu::tsp::detail
