// What the sequence-sharded attention cores share (private to tspemu::tsp): the shape check and a
// state holding the rank, the shape and every rank's global positions, with the check that a
// call's dims are the shape's.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"

namespace tspemu::tsp::detail {

// Throws unless the shape is one SequenceShardedAttention runs on this world.
inline void check_sequence_shape(const char* who, Rank& rank, const BaselineShape& s) {
  s.validate();
  if (s.T != 1 || s.sequence_parallel || rank.size() != s.Sp)
    throw std::invalid_argument(std::string(who) + ": needs T=1 (got " + std::to_string(s.T) +
                                "), no Megatron-SP and Sp=" + std::to_string(s.Sp) +
                                " equal to the world's " + std::to_string(rank.size()) + " ranks");
}

// A core's state, shared by its forward and backward closures (held by std::shared_ptr).
struct CoreState {
  CoreState(const char* who_, Rank& rank_, const BaselineShape& s)
      : who(who_), rank(&rank_), shape(s) {
    check_sequence_shape(who, rank_, s);
    const SequenceLayout layout = s.row_layout();
    positions =
        rank_.arena().allocate<std::int64_t>(static_cast<std::size_t>(s.S), Category::other);
    if (dry_run()) return;  // unbacked (core/dry_run.hpp)
    for (int q = 0; q < s.Sp; ++q)
      for (int i = 0; i < s.Tl(); ++i)
        positions[static_cast<std::size_t>(q) * s.Tl() + i] = layout.position(q, i);
  }

  // Rank q's global positions [Tl] (its tokens, its K/V block's keys).
  const std::int64_t* of(int q) const {
    return positions.data() + static_cast<std::size_t>(q) * shape.Tl();
  }

  // The block (SequenceShardedAttention or the reference block) must call the core with the
  // shape's local dims {B, Tl, Tl, NH, NKV, hs}.
  void check(const ref::AttentionDims& d) const {
    const BaselineShape& s = shape;
    if (d.B == s.B && d.Tq == s.Tl() && d.Tk == s.Tl() && d.NH == s.model.n_heads &&
        d.NKV == s.model.n_kv_heads && d.hs == s.hs())
      return;
    throw std::invalid_argument(
        std::string(who) + ": called with B=" + std::to_string(d.B) +
        " Tq=" + std::to_string(d.Tq) + " Tk=" + std::to_string(d.Tk) +
        " NH=" + std::to_string(d.NH) + " NKV=" + std::to_string(d.NKV) +
        " hs=" + std::to_string(d.hs) + ", built for B=" + std::to_string(s.B) +
        " Tl=" + std::to_string(s.Tl()) + " NH=" + std::to_string(s.model.n_heads) +
        " NKV=" + std::to_string(s.model.n_kv_heads) + " hs=" + std::to_string(s.hs()));
  }

  const char* who;
  Rank* rank;
  BaselineShape shape;
  // [n·Tl]: rank q's positions at [q·Tl, (q+1)·Tl) — the rank-major order in which the Ulysses
  // exchange gathers tokens (Category::other).
  Buffer<std::int64_t> positions;
};

}  // namespace tspemu::tsp::detail
