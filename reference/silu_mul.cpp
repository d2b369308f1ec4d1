#include "tspemu/reference/silu_mul.hpp"

#include <cmath>

#include "tspemu/core/dry_run.hpp"

namespace tspemu::ref {

template <class T>
void silu_mul_forward(T* h, const T* g, const T* u, std::size_t n) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (std::size_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

template <class T>
void silu_mul_backward(T* dgate, T* dup, const T* dh, const T* g, const T* u, std::size_t n) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
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
