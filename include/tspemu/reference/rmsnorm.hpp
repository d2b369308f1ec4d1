// RMSNorm kernel (Llama): y = x / sqrt(mean(x²) + eps) * w, over the last dimension.
//
// What: forward and backward on raw row-major buffers of N rows (N = B*T tokens, or a rank's
//   local tokens) by C channels.
// Requirements: out/dx must not alias inputs; C > 0.
// Guarantees: forward writes rstd[n] = 1/sqrt(mean(x[n]²) + eps), which backward needs.
//   Backward overwrites dx and ACCUMULATES into dw (so per-rank or per-block partials add up).
//   Sums over C run in index order in the scalar type T (the float reference is the naive one).
#pragma once

namespace tspemu::ref {

// torch: out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
template <class T>
void rmsnorm_forward(T* out,      // [N, C]
                     T* rstd,     // [N]
                     const T* x,  // [N, C]
                     const T* w,  // [C]
                     int N, int C, double eps);

// dx = rstd * (w*dy) - x * rstd³ / C * sum_c(w*dy*x);  dw += sum_n dy * x * rstd
template <class T>
void rmsnorm_backward(T* dx,          // [N, C], overwritten
                      T* dw,          // [C], accumulated
                      const T* dout,  // [N, C]
                      const T* x,     // [N, C]
                      const T* w,     // [C]
                      const T* rstd,  // [N], from forward
                      int N, int C);

}  // namespace tspemu::ref
