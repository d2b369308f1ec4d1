#include "tspemu/reference/rmsnorm.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "tspemu/core/dry_run.hpp"
#include "wide_clones.hpp"

namespace tspemu::ref {

namespace {

// sum_c a[c] · w[c] · b[c] (w = nullptr: sum_c a[c] · b[c]) for the float kernels, multiplied
// in that order: sixteen lane partial sums, each in index order, then a fixed pairwise tree, the
// same in every clone (wide_clones.hpp). One dependency chain per lane instead of one per row: a
// row of C = 1024 is 64 vector steps, not 1024 scalar adds.
TSPEMU_WIDE_CLONES float dot_f32(const float* a, const float* w, const float* b, int n) {
  f32x16 acc{};
  for (int c = 0; c < n; c += 16) {
    // The tail padded with zeros: adds +0 to no lane's sum that was not +0 before.
    const std::size_t bytes = std::size_t(std::min(16, n - c)) * sizeof(float);
    f32x16 x{}, y{}, v = f32x16{} + 1.0f;
    if (bytes == sizeof x) {  // fixed size: vector loads
      std::memcpy(&x, a + c, sizeof x);
      std::memcpy(&y, b + c, sizeof y);
      if (w) std::memcpy(&v, w + c, sizeof v);
    } else {
      std::memcpy(&x, a + c, bytes);
      std::memcpy(&y, b + c, bytes);
      if (w) std::memcpy(&v, w + c, bytes);
    }
    acc += w ? x * v * y : x * y;
  }
  return tree_sum(acc);
}

}  // namespace

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int N, int C, double eps) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (int n = 0; n < N; ++n) {
    const T* xr = x + std::size_t(n) * C;
    T* yr = out + std::size_t(n) * C;
    T ss = 0;
    if constexpr (std::is_same_v<T, float>) {
      ss = dot_f32(xr, nullptr, xr, C);
    } else {
      for (int c = 0; c < C; ++c) ss += xr[c] * xr[c];
    }
    const T r = T(1) / std::sqrt(ss / T(C) + T(eps));
    rstd[n] = r;
    for (int c = 0; c < C; ++c) yr[c] = xr[c] * r * w[c];
  }
}

template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int N,
                      int C) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (int n = 0; n < N; ++n) {
    const T* xr = x + std::size_t(n) * C;
    const T* dyr = dout + std::size_t(n) * C;
    T* dxr = dx + std::size_t(n) * C;
    const T r = rstd[n];
    // y_c = x_c r w_c with r = (mean(x²)+eps)^(-1/2), dr/dx_c = -r³ x_c / C.
    T dot = 0;  // sum_c dy_c w_c x_c
    if constexpr (std::is_same_v<T, float>) {
      dot = dot_f32(dyr, w, xr, C);
    } else {
      for (int c = 0; c < C; ++c) dot += dyr[c] * w[c] * xr[c];
    }
    const T coef = dot * r * r * r / T(C);
    for (int c = 0; c < C; ++c) {
      dxr[c] = dyr[c] * w[c] * r - xr[c] * coef;
      dw[c] += dyr[c] * xr[c] * r;
    }
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int,
                                      double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*,
                                       const double*, const double*, int, int);

}  // namespace tspemu::ref
