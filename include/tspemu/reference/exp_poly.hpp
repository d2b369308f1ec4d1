// A vectorized fp32 exp for the float reference's softmax and SiLU (the double oracle keeps
// std::exp).
//
// What: exp(x) on four floats at once (GCC/Clang vector extensions: SSE2 on the baseline x86-64
//   build, NEON on AArch64), by range reduction and a polynomial:
//     n = round(x · log2 e),  r = x - n · ln 2  (ln 2 split in two, Cody-Waite, so n · hi is exact)
//     exp(x) = p(r) · 2^n,  p the Cephes expf minimax polynomial of degree 7 on |r| <= ln2 / 2
//   2^n is applied as two exact power-of-two factors 2^(n/2) · 2^(n - n/2), so results down to
//   the smallest subnormal and up to FLT_MAX come out without a special case.
//   std::exp per element (glibc's scalar expf) is a call and a dependency chain per score; this
//   is ~20 vector instructions per four elements with no branch.
// Accuracy (tests/reference/exp_poly_test.cpp, against exp in double rounded to float, on every
//   64th float of [-120, 95]): at most 1 ulp, subnormal results included; exp(-inf) = 0 and
//   results below half the smallest subnormal (x < -103.97) are 0, +inf for x > 88.72 (and
//   x = +inf), NaN for NaN.
// Guarantees: elementwise and branch-free: a value's result does not depend on its lane or on
//   its neighbours, so any blocking of a row gives bitwise the same results. Not correctly
//   rounded, and not std::exp: fp32 kernels using it differ from std::exp-based ones by ~1 ulp
//   per exp, within the fp64-oracle rule (include/tspemu/reference/numerics.hpp).
// Cost: ~20 SIMD operations per 4 values.
#pragma once

#include <cstdint>
#include <cstring>

namespace tspemu::ref {

using f32x4 = float __attribute__((vector_size(16)));
using i32x4 = std::int32_t __attribute__((vector_size(16)));

inline f32x4 load_f32x4(const float* p) {
  f32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store_f32x4(float* p, f32x4 v) {
  std::memcpy(p, &v, sizeof v);
}

// exp of every lane of x, in place, for any GCC/Clang float vector type F (f32x4 below; wider
// types inside functions compiled for a wider instruction set). By reference and always inlined:
// a vector wider than the caller's ABI vectors must not cross a call.
template <class F>
[[gnu::always_inline]] inline void exp_poly_in_place(F& x) {
  using I = decltype(x < x);  // the lane mask type: int32 lanes of -1 / 0
  // Clamp to [-110, 89]: below, every result rounds to 0; above, to +inf (via the scale). A NaN
  // compares false both times and stays in x, so it propagates.
  const I below = x < -110.0f;
  x = (F)((below & (I)(F{} - 110.0f)) | (~below & (I)x));
  const I above = x > 89.0f;
  x = (F)((above & (I)(F{} + 89.0f)) | (~above & (I)x));
  // Round to nearest by the 1.5 · 2^23 shift: n is then the low bits of t, no float-to-int
  // conversion (undefined for NaN).
  const float shifter = 12582912.0f;
  const F t = x * 1.44269504088896341f + shifter;
  const F n = t - shifter;
  const I ni = (I)t - (I)(F{} + shifter);
  // ln 2 = 0.693359375 - 2.12194440e-4 (+ 1e-12): 0.693359375 has 9 significant bits, so n · hi
  // is exact for |n| < 2^15.
  F r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F y = p * (r * r) + r + 1.0f;
  // n in [-159, 129]: both halves in [-80, 65], so both scale factors are normal floats.
  const I n1 = ni >> 1, n2 = ni - n1;
  x = y * (F)((n1 + 127) << 23) * (F)((n2 + 127) << 23);
}

inline f32x4 exp_poly(f32x4 x) {
  exp_poly_in_place(x);
  return x;
}

// One value, through the same vector code (so bitwise equal to a lane of exp_poly(f32x4)).
inline float exp_poly(float x) {
  return exp_poly(f32x4{x, x, x, x})[0];
}

}  // namespace tspemu::ref
