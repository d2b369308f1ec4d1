// What the sequence-sharded attention cores share (private to tspemu::tsp): the shape check and a
// state holding the group the core runs on, this rank's arena, the block's local dims and every
// member's global positions, with the check that a call's dims are the core's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"

namespace tspemu::tsp::detail {

// Throws unless the shape is one SequenceShardedAttention runs on a group of `ranks` ranks.
inline void check_sequence_shape(const char* who, int ranks, const BaselineShape& s) {
  s.validate();
  if (s.T != 1 || s.sequence_parallel || ranks != s.Sp)
    throw std::invalid_argument(std::string(who) + ": needs T=1 (got " + std::to_string(s.T) +
                                "), no Megatron-SP and Sp=" + std::to_string(s.Sp) +
                                " equal to the group's " + std::to_string(ranks) + " ranks");
}

// The local dims {B, Tl, Tl, NH, NKV, hs} a block of `s` calls its core with.
inline ref::AttentionDims sequence_dims(const BaselineShape& s) {
  return {s.B, s.Tl(), s.Tl(), s.model.n_heads, s.model.n_kv_heads, s.hs()};
}

// Every member's global positions, member-major [n·Tl]: the world's zigzag rows of `s`.
inline std::vector<std::int64_t> row_positions(const BaselineShape& s) {
  std::vector<std::int64_t> all;
  const SequenceLayout layout = s.row_layout();
  for (int q = 0; q < s.Sp; ++q)
    for (std::int64_t p : layout.positions(q)) all.push_back(p);
  return all;
}

// A core's state, shared by its forward and backward closures (held by std::shared_ptr).
struct CoreState {
  CoreState(const char* who_, Comm& comm_, Arena& arena_, const ref::AttentionDims& dims_,
            std::span<const std::int64_t> all)
      : who(who_), comm(&comm_), arena(&arena_), dims(dims_) {
    const std::size_t n = static_cast<std::size_t>(comm_.size());
    if (dims.Tq != dims.Tk || all.size() != n * static_cast<std::size_t>(dims.Tq))
      throw std::invalid_argument(std::string(who) + ": " + std::to_string(all.size()) +
                                  " positions for a group of " + std::to_string(n) +
                                  " ranks of Tq=" + std::to_string(dims.Tq) +
                                  " Tk=" + std::to_string(dims.Tk) + " tokens (needs Tq = Tk)");
    positions = arena_.allocate<std::int64_t>(all.size(), Category::other);
    if (dry_run()) return;  // unbacked (core/dry_run.hpp)
    std::copy(all.begin(), all.end(), positions.begin());
  }

  // Member q's global positions [Tl] (its tokens, its K/V block's keys).
  const std::int64_t* of(int q) const {
    return positions.data() + static_cast<std::size_t>(q) * dims.Tq;
  }

  // The block (SequenceShardedAttention or the reference block) must call the core with the
  // dims it was built for.
  void check(const ref::AttentionDims& d) const {
    const ref::AttentionDims& s = dims;
    if (d.B == s.B && d.Tq == s.Tq && d.Tk == s.Tk && d.NH == s.NH && d.NKV == s.NKV &&
        d.hs == s.hs)
      return;
    throw std::invalid_argument(std::string(who) + ": called with B=" + std::to_string(d.B) +
                                " Tq=" + std::to_string(d.Tq) + " Tk=" + std::to_string(d.Tk) +
                                " NH=" + std::to_string(d.NH) + " NKV=" + std::to_string(d.NKV) +
                                " hs=" + std::to_string(d.hs) +
                                ", built for B=" + std::to_string(s.B) +
                                " Tl=" + std::to_string(s.Tq) + " NH=" + std::to_string(s.NH) +
                                " NKV=" + std::to_string(s.NKV) + " hs=" + std::to_string(s.hs));
  }

  const char* who;
  Comm* comm;
  Arena* arena;
  ref::AttentionDims dims;
  // [n·Tl]: member q's positions at [q·Tl, (q+1)·Tl) — the member-major order in which the
  // Ulysses exchange gathers tokens (Category::other).
  Buffer<std::int64_t> positions;
};

}  // namespace tspemu::tsp::detail
