#include "tspemu/reference/rmsnorm.hpp"

#include <cmath>
#include <cstddef>

#include "tspemu/core/dry_run.hpp"

namespace tspemu::ref {

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int N, int C, double eps) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (int n = 0; n < N; ++n) {
    const T* xr = x + std::size_t(n) * C;
    T* yr = out + std::size_t(n) * C;
    T ss = 0;
    for (int c = 0; c < C; ++c) ss += xr[c] * xr[c];
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
    for (int c = 0; c < C; ++c) dot += dyr[c] * w[c] * xr[c];
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
