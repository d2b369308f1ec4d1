// Shared by the sequence-sharded attention cores (private to tspemu::tsp): the check that a call's
// dims are the shape's, and every rank's global positions.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tspemu/reference/attention.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/baseline_shape.hpp"

namespace tspemu::tsp::detail {

// The block (SequenceShardedAttention or the reference block) must call the core with the
// shape's local dims: {B, Tl, Tl, NH, NKV, hs}.
inline void check_core_dims(const char* core, const BaselineShape& s, const ref::AttentionDims& d) {
  const ref::AttentionDims want{s.B, s.Tl(), s.Tl(), s.model.n_heads, s.model.n_kv_heads, s.hs()};
  if (d.B != want.B || d.Tq != want.Tq || d.Tk != want.Tk || d.NH != want.NH || d.NKV != want.NKV ||
      d.hs != want.hs)
    throw std::invalid_argument(
        std::string(core) + ": called with B=" + std::to_string(d.B) +
        " Tq=" + std::to_string(d.Tq) + " Tk=" + std::to_string(d.Tk) +
        " NH=" + std::to_string(d.NH) + " NKV=" + std::to_string(d.NKV) +
        " hs=" + std::to_string(d.hs) + ", built for B=" + std::to_string(want.B) +
        " Tl=" + std::to_string(want.Tq) + " NH=" + std::to_string(want.NH) +
        " NKV=" + std::to_string(want.NKV) + " hs=" + std::to_string(want.hs));
}

// [n·Tl]: rank q's global positions at [q·Tl, (q+1)·Tl) — the rank-major order in which the
// Ulysses exchange gathers tokens, and the key positions of each ring block (Category::other).
inline Buffer<std::int64_t> rank_major_positions(Rank& rank, const BaselineShape& s) {
  const SequenceLayout layout = s.row_layout();
  auto p = rank.arena().allocate<std::int64_t>(static_cast<std::size_t>(s.S), Category::other);
  for (int q = 0; q < s.Sp; ++q)
    for (int i = 0; i < s.Tl(); ++i)
      p[static_cast<std::size_t>(q) * s.Tl() + i] = layout.position(q, i);
  return p;
}

// Throws unless the shape is one SequenceShardedAttention runs on this world.
inline void check_sequence_shape(const char* core, Rank& rank, const BaselineShape& s) {
  s.validate();
  if (s.T != 1 || s.sequence_parallel || rank.size() != s.Sp)
    throw std::invalid_argument(std::string(core) + ": needs T=1 (got " + std::to_string(s.T) +
                                "), no Megatron-SP and Sp=" + std::to_string(s.Sp) +
                                " equal to the world's " + std::to_string(rank.size()) + " ranks");
}

}  // namespace tspemu::tsp::detail
