#include "tspemu/reference/rope.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/core/dry_run.hpp"

namespace tspemu::ref {

namespace {

// cos/sin tables [T, hs/2] for one set of positions, computed in double for every scalar type
// (see header).
template <class T>
struct RopeTables {
  std::vector<std::int64_t> positions;
  int hs = 0;
  double base = 0;
  std::vector<T> cos_t, sin_t;
};

// The calling thread's tables for (positions, hs, base), recomputed only when one of them
// changed since its last call: a rank's blocks rotate Q, K and their gradients at the same
// positions several times per layer, and each table costs T · hs/2 pow, cos and sin in double.
// The values are the same computed or reused, so results do not depend on the cache.
template <class T>
const RopeTables<T>& rope_tables(const std::int64_t* positions, int T_, int hs, double base) {
  if (hs % 2 != 0) throw std::invalid_argument("rope: head size " + std::to_string(hs) + " is odd");
  thread_local RopeTables<T> tables;
  if (tables.hs == hs && tables.base == base &&
      std::equal(positions, positions + T_, tables.positions.begin(), tables.positions.end()))
    return tables;
  const int half = hs / 2;
  tables.positions.assign(positions, positions + T_);
  tables.hs = hs;
  tables.base = base;
  tables.cos_t.resize(std::size_t(T_) * half);
  tables.sin_t.resize(std::size_t(T_) * half);
  for (int t = 0; t < T_; ++t) {
    for (int i = 0; i < half; ++i) {
      const double inv_freq = 1.0 / std::pow(base, double(2 * i) / double(hs));
      const double angle = double(positions[t]) * inv_freq;
      tables.cos_t[std::size_t(t) * half + i] = T(std::cos(angle));
      tables.sin_t[std::size_t(t) * half + i] = T(std::sin(angle));
    }
  }
  return tables;
}

// Rotates (a, b) = (x[i], x[i+half]) by +angle (forward) or -angle (backward).
template <class T>
void rope_apply(T* x, const std::int64_t* positions, int B, int T_, int NH, int hs, double base,
                bool inverse) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  const RopeTables<T>& tables = rope_tables<T>(positions, T_, hs, base);
  const std::vector<T>& cos_t = tables.cos_t;
  const std::vector<T>& sin_t = tables.sin_t;
  const int half = hs / 2;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T_; ++t) {
      const T* ct = cos_t.data() + std::size_t(t) * half;
      const T* st = sin_t.data() + std::size_t(t) * half;
      for (int h = 0; h < NH; ++h) {
        T* xh = x + ((std::size_t(b) * T_ + t) * NH + h) * hs;
        for (int i = 0; i < half; ++i) {
          const T a = xh[i], c = xh[i + half];
          const T s = inverse ? -st[i] : st[i];
          xh[i] = a * ct[i] - c * s;         // x*cos + (-x2)*sin
          xh[i + half] = c * ct[i] + a * s;  // x2*cos + x1*sin
        }
      }
    }
  }
}

}  // namespace

template <class T>
void rope_forward(T* x, const std::int64_t* positions, int B, int T_, int NH, int hs, double base) {
  rope_apply(x, positions, B, T_, NH, hs, base, /*inverse=*/false);
}

template <class T>
void rope_backward(T* d, const std::int64_t* positions, int B, int T_, int NH, int hs,
                   double base) {
  rope_apply(d, positions, B, T_, NH, hs, base, /*inverse=*/true);
}

template void rope_forward<float>(float*, const std::int64_t*, int, int, int, int, double);
template void rope_forward<double>(double*, const std::int64_t*, int, int, int, int, double);
template void rope_backward<float>(float*, const std::int64_t*, int, int, int, int, double);
template void rope_backward<double>(double*, const std::int64_t*, int, int, int, int, double);

}  // namespace tspemu::ref
