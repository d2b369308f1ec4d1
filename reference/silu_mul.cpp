#include "tspemu/reference/silu_mul.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/exp_poly.hpp"
#include "wide_clones.hpp"

namespace tspemu::ref {

namespace {

// The float kernels run on sixteen-lane groups of [0, n), the last one padded with zeros, and
// store the valid lanes. Elementwise, so every lane width gives the same bits. Plain loops, no
// lambdas: a lambda's body is not cloned with its caller (wide_clones.hpp).
// By reference, never returned: see exp_poly_in_place.
[[gnu::always_inline]] inline void load_lanes(f32x16& v, const float* p, int lanes) {
  v = f32x16{};
  if (lanes == 16)
    std::memcpy(&v, p, sizeof v);  // fixed size: a vector load
  else
    std::memcpy(&v, p, static_cast<std::size_t>(lanes) * sizeof(float));
}

[[gnu::always_inline]] inline void store_lanes(float* p, const f32x16& v, int lanes) {
  if (lanes == 16)
    std::memcpy(p, &v, sizeof v);
  else
    std::memcpy(p, &v, static_cast<std::size_t>(lanes) * sizeof(float));
}

// silu(g) = g / (1 + exp(-g)) as g · s with s = 1 / (1 + exp(-g)).
[[gnu::always_inline]] inline void sigmoid(f32x16& s, const f32x16& g) {
  s = -g;
  exp_poly_in_place(s);
  s = 1.0f / (1.0f + s);
}

TSPEMU_WIDE_CLONES void silu_mul_forward_f32(float* h, const float* g, const float* u,
                                             std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) {
    const int lanes = static_cast<int>(std::min<std::size_t>(16, n - i));
    f32x16 gv, uv, s;
    load_lanes(gv, g + i, lanes);
    load_lanes(uv, u + i, lanes);
    sigmoid(s, gv);
    store_lanes(h + i, gv * s * uv, lanes);
  }
}

TSPEMU_WIDE_CLONES void silu_mul_backward_f32(float* dgate, float* dup, const float* dh,
                                              const float* g, const float* u, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) {
    const int lanes = static_cast<int>(std::min<std::size_t>(16, n - i));
    f32x16 gv, dhv, uv, s;
    load_lanes(gv, g + i, lanes);
    load_lanes(dhv, dh + i, lanes);
    load_lanes(uv, u + i, lanes);
    sigmoid(s, gv);
    store_lanes(dgate + i, dhv * uv * s * (1.0f + gv * (1.0f - s)), lanes);
    store_lanes(dup + i, dhv * gv * s, lanes);
  }
}

}  // namespace

template <class T>
void silu_mul_forward(T* h, const T* g, const T* u, std::size_t n) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  if constexpr (std::is_same_v<T, float>) {
    silu_mul_forward_f32(h, g, u, n);
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
    silu_mul_backward_f32(dgate, dup, dh, g, u, n);
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
