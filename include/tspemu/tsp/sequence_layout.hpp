// SequenceLayout: which tokens of each sequence a rank holds, as a permutation.
//
// What: D ranks split every sequence of S tokens into D shards of S/D tokens. Local token i of rank
// r sits at global position position(r, i):
//   contiguous  r·(S/D) + i
//   zigzag      cut the sequence into 2D chunks of c = S/(2D); rank r holds chunks r and 2D-1-r,
//               in that order: r·c + i for i < c, else (2D-1-r)·c + (i-c). Every rank then does the
//               same causal-attention work (Megatron-LM context parallel, ring-flash-attention).
//   striped     i·D + r (token t on rank t mod D)
// TwoLevelLayout: the sequence cut over R outer ranks by one layout, then each outer shard's
//   S/R tokens cut again over U inner ranks by another; rank (o, i) holds
//   position(o, i, t) = outer.position(o, inner.position(i, t)), S/(R·U) tokens. USP uses zigzag
//   over the ring axis (balanced causal work round the ring) then contiguous over the Ulysses
//   axis (whose exchange gathers the row's tokens back): a row's tokens are then the ring's
//   zigzag shard, ascending.
// Requirements: S divisible by D (by 2D for zigzag); checked by the constructor.
// Guarantees: every global position belongs to exactly one (rank, i); scatter/gather move whole
// token rows of [B, S, C] tensors to and from [B, S/D, C] shards.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tspemu/plan/layout_kind.hpp"

namespace tspemu::tsp {

class SequenceLayout {
 public:
  SequenceLayout(LayoutKind kind, int ranks, int seq_len);

  LayoutKind kind() const { return kind_; }
  int ranks() const { return ranks_; }
  int seq_len() const { return seq_len_; }
  int local_tokens() const { return seq_len_ / ranks_; }
  std::int64_t position(int rank, int i) const;
  std::vector<std::int64_t> positions(int rank) const;  // [S/D], global positions, local order

  // shard[b, i, :] = full[b, position(rank, i), :]        full [B, S, C] -> shard [B, S/D, C]
  template <class T>
  void scatter(const T* full, T* shard, int rank, int B, int C) const;
  // full[b, position(rank, i), :] = shard[b, i, :]        the inverse, for one rank's rows
  template <class T>
  void gather(const T* shard, T* full, int rank, int B, int C) const;

 private:
  LayoutKind kind_;
  int ranks_;
  int seq_len_;
};

class TwoLevelLayout {
 public:
  // std::invalid_argument naming both levels unless S fits the outer layout and S/R the inner.
  TwoLevelLayout(LayoutKind outer, int outer_ranks, LayoutKind inner, int inner_ranks, int seq_len);

  const SequenceLayout& outer() const { return outer_; }
  const SequenceLayout& inner() const { return inner_; }  // over the S/R tokens of an outer shard
  int local_tokens() const { return inner_.local_tokens(); }
  std::int64_t position(int outer_rank, int inner_rank, int i) const {
    return outer_.position(outer_rank, static_cast<int>(inner_.position(inner_rank, i)));
  }
  // [S/(R·U)] global positions of rank (outer_rank, inner_rank), in local order.
  std::vector<std::int64_t> positions(int outer_rank, int inner_rank) const;

 private:
  static SequenceLayout checked_outer(LayoutKind outer, int outer_ranks, LayoutKind inner,
                                      int inner_ranks, int seq_len);
  SequenceLayout outer_;
  SequenceLayout inner_;
};

}  // namespace tspemu::tsp
