#include "tspemu/reference/silu_mul.hpp"

#include <cmath>
#include <type_traits>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/exp_poly.hpp"

namespace tspemu::ref {

namespace {

// Calls f(i, lanes) on the four-lane groups of [0, n), the last one padded with zeros: the float
// kernels' elementwise body runs on vectors (exp_poly), its results stored for the valid lanes.
template <class F>
void for_each_f32x4(std::size_t n, F f) {
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) f(i, 4);
  if (i < n) f(i, static_cast<int>(n - i));
}

f32x4 load_lanes(const float* p, int lanes) {
  if (lanes == 4) return load_f32x4(p);
  f32x4 v{};
  for (int l = 0; l < lanes; ++l) v[l] = p[l];
  return v;
}

void store_lanes(float* p, f32x4 v, int lanes) {
  if (lanes == 4) return store_f32x4(p, v);
  for (int l = 0; l < lanes; ++l) p[l] = v[l];
}

}  // namespace

template <class T>
void silu_mul_forward(T* h, const T* g, const T* u, std::size_t n) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  if constexpr (std::is_same_v<T, float>) {
    for_each_f32x4(n, [&](std::size_t i, int lanes) {
      const f32x4 gv = load_lanes(g + i, lanes);
      const f32x4 s = 1.0f / (1.0f + exp_poly(-gv));
      store_lanes(h + i, gv * s * load_lanes(u + i, lanes), lanes);
    });
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

template <class T>
void silu_mul_backward(T* dgate, T* dup, const T* dh, const T* g, const T* u, std::size_t n) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  if constexpr (std::is_same_v<T, float>) {
    for_each_f32x4(n, [&](std::size_t i, int lanes) {
      const f32x4 gv = load_lanes(g + i, lanes), dhv = load_lanes(dh + i, lanes);
      const f32x4 s = 1.0f / (1.0f + exp_poly(-gv));
      store_lanes(dgate + i, dhv * load_lanes(u + i, lanes) * s * (1.0f + gv * (1.0f - s)), lanes);
      store_lanes(dup + i, dhv * gv * s, lanes);
    });
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-g[i]));
    // d/dg [g s(g)] = s + g s (1 - s)
    dgate[i] = dh[i] * u[i] * s * (T(1) + g[i] * (T(1) - s));
    dup[i] = dh[i] * g[i] * s;
  }
}

template void silu_mul_forward<float>(float*, const float*, const float*, std::size_t);
template void silu_mul_forward<double>(double*, const double*, const double*, std::size_t);
template void silu_mul_backward<float>(float*, float*, const float*, const float*, const float*,
                                       std::size_t);
template void silu_mul_backward<double>(double*, double*, const double*, const double*,
                                        const double*, std::size_t);

}  // namespace tspemu::ref
