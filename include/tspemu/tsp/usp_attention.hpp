// USP attention core (unified sequence parallelism): DeepSpeed-Ulysses within a row of U ranks,
// ring attention across the R rows of a 2-D mesh, on tokens laid out in two levels.
//
// What (rank at row o = ring.rank(), column i = ulysses.rank(); Tl local tokens; layout zigzag
// over the R rows, then contiguous over the U ranks of a row, sequence_layout.hpp):
//   the Ulysses core on the row (ulysses_attention.hpp) trades the sequence axis for the head
//   axis: the row's U·Tl tokens (row o's zigzag shard, in position order) on NH/U query and
//   NKV/U KV heads; its inner core is ring attention (ring_attention.hpp) on the column, whose
//   member q holds row q's tokens on the same heads. Backward is the same in reverse.
// Requirements: U | NH and U | NKV; the layout's outer ranks R = ring.size() and inner ranks
//   U = ulysses.size(); dims the block's local {B, Tl, Tl, NH, NKV, hs} with Tl the layout's
//   local tokens (std::invalid_argument naming the values otherwise). Every rank of both groups
//   calls the core's functions in the same order.
// Guarantees: every sum in a fixed order (the ring's and the exchanges'), so results are bitwise
//   reproducible; R = 1 is Ulysses on the row, U = 1 ring attention on the column.
// Cost (per call, M = B·Tl, activation elements, (U-1)/U of each all-to-all crossing): forward
//   4 all-to-alls (Q, K, V to heads, A back) and R-1 ring hops of a 2·M·kv_dim block; backward
//   8 all-to-alls (Q, K, V, dA and A to heads, dQ, dK, dV back) and 2R-1 hops; compute as the
//   reference attention of U·Tl queries on NH/U heads against the sequence's keys.
#pragma once

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/sequence_layout.hpp"

namespace tspemu::tsp {

ref::AttentionCore<float> usp_attention_core(Comm& ulysses, Comm& ring, Arena& arena,
                                             const ref::AttentionDims& dims,
                                             const TwoLevelLayout& layout);

}  // namespace tspemu::tsp
