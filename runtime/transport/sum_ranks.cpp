#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "transport.hpp"

namespace tspemu::detail {

namespace {

// acc is sum_typed's tile, never a source (restrict), and the inner loop has a constant trip
// count: GCC's -O2 cost model vectorizes only loops it need not version for aliasing or give a
// scalar remainder, so the plain loop here ran one addss per element (objdump). Lanes are
// independent elements: each element's additions keep their rank order, so the bits are the same.
template <class T>
void add_typed(T* __restrict acc, const T* __restrict src, std::size_t n) {
  constexpr std::size_t kBlock = 64 / sizeof(T);  // one cache line
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (std::size_t l = 0; l < kBlock; ++l) acc[i + l] += src[i + l];
  for (; i < n; ++i) acc[i] += src[i];
}

template <class T>
void sum_typed(T* out, const std::byte* const* srcs, int n, std::size_t count) {
  if (count * sizeof(T) <= kSmallMessageBytes) {
    // The one-step all_reduce's few elements: the tiled loops below cost more set-up per call
    // than these sums. Same additions in the same order per element (so bitwise the same sums),
    // into a local copy first, so `out` may alias a source.
    T sum[kSmallMessageBytes / sizeof(T)];
    for (std::size_t i = 0; i < count; ++i) {
      T v = reinterpret_cast<const T*>(srcs[0])[i];
      for (int r = 1; r < n; ++r) v += reinterpret_cast<const T*>(srcs[r])[i];
      sum[i] = v;
    }
    std::memcpy(out, sum, count * sizeof(T));
    return;
  }
  // Tiles keep the accumulator in L1 and make out aliasing a source safe: a tile is read from
  // every source before it is written.
  constexpr std::size_t kTile = 1024;
  // The accumulator sits half a page away from `out` in its page offset: a tile whose address
  // matched out's (or a source's, which usually shares out's offset) modulo 4 KiB made every
  // load of the sum wait on the 4K-aliasing check against the tile's stores (a large reduce's
  // time then depended on where the stack was: docs/benchmarks.md).
  constexpr std::size_t kPage = 4096;
  alignas(kPage) std::byte space[kPage + kTile * sizeof(T)];
  const std::size_t shift = (reinterpret_cast<std::uintptr_t>(out) + kPage / 2) % kPage / 64 * 64;
  T* const acc = reinterpret_cast<T*>(space + shift);
  for (std::size_t t = 0; t < count; t += kTile) {
    const std::size_t len = std::min(kTile, count - t);
    const T* s0 = reinterpret_cast<const T*>(srcs[0]) + t;
    for (std::size_t i = 0; i < len; ++i) acc[i] = s0[i];
    for (int r = 1; r < n; ++r) add_typed(acc, reinterpret_cast<const T*>(srcs[r]) + t, len);
    std::memcpy(out + t, acc, len * sizeof(T));
  }
}

}  // namespace

void sum_ranks_into(Dtype dtype, std::byte* acc, const std::byte* const* srcs, int n,
                    std::size_t count) {
  if (count == 0) return;
  switch (dtype) {
    case Dtype::f32:
      return sum_typed(reinterpret_cast<float*>(acc), srcs, n, count);
    case Dtype::f64:
      return sum_typed(reinterpret_cast<double*>(acc), srcs, n, count);
    case Dtype::i32:
      return sum_typed(reinterpret_cast<std::int32_t*>(acc), srcs, n, count);
    case Dtype::i64:
      return sum_typed(reinterpret_cast<std::int64_t*>(acc), srcs, n, count);
    case Dtype::byte:
      break;
  }
  throw std::invalid_argument("reductions are not defined for raw bytes");
}

}  // namespace tspemu::detail
