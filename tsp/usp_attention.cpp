#include "tspemu/tsp/usp_attention.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/tsp/ring_attention.hpp"
#include "tspemu/tsp/ulysses_attention.hpp"

namespace tspemu::tsp {

ref::AttentionCore<float> usp_attention_core(Comm& ulysses, Comm& ring, Arena& arena,
                                             const ref::AttentionDims& dims,
                                             const TwoLevelLayout& layout) {
  const int U = ulysses.size(), R = ring.size();
  if (layout.outer().ranks() != R || layout.inner().ranks() != U ||
      dims.Tq != layout.local_tokens() || U < 1 || dims.NH % U != 0 || dims.NKV % U != 0)
    throw std::invalid_argument(
        "USP attention: Ulysses group of U=" + std::to_string(U) +
        " and ring of R=" + std::to_string(R) +
        " ranks need a layout over R=" + std::to_string(layout.outer().ranks()) +
        " rows of U=" + std::to_string(layout.inner().ranks()) + " ranks, Tl=" +
        std::to_string(layout.local_tokens()) + " tokens (got Tq=" + std::to_string(dims.Tq) +
        ") and U | NH=" + std::to_string(dims.NH) + ", U | NKV=" + std::to_string(dims.NKV));
  const int row = ring.rank();
  // The row's members' tokens, member-major (what the Ulysses exchange gathers).
  std::vector<std::int64_t> row_positions;
  for (int i = 0; i < U; ++i)
    for (std::int64_t p : layout.positions(row, i)) row_positions.push_back(p);
  // Every row's tokens in position order: the heads layout the ring passes round.
  std::vector<std::int64_t> ring_positions;
  for (int o = 0; o < R; ++o) {
    std::vector<std::int64_t> p = layout.outer().positions(o);
    std::sort(p.begin(), p.end());
    ring_positions.insert(ring_positions.end(), p.begin(), p.end());
  }
  const ref::AttentionDims heads{dims.B,      U * dims.Tq,  U * dims.Tk,
                                 dims.NH / U, dims.NKV / U, dims.hs};
  return ulysses_attention_core(ulysses, arena, dims, row_positions,
                                ring_attention_core(ring, arena, heads, ring_positions));
}

}  // namespace tspemu::tsp
