// Gated-MLP activation (SwiGLU): h = silu(g) * u, elementwise.
//
// What: the middle of the Llama MLP down(silu(gate(x)) * up(x)), on raw buffers of n elements.
// Requirements: outputs do not alias inputs.
// Guarantees: backward overwrites dgate and dup. sigmoid is computed as 1/(1+exp(-g)) in T, exp
//   being std::exp for double (the oracle) and exp_poly for float (exp_poly.hpp: <= 1 ulp, four
//   elements at a time; each element's result independent of n and of its position).
#pragma once

#include <cstddef>

namespace tspemu::ref {

// torch: h = F.silu(g) * u
template <class T>
void silu_mul_forward(T* h,        // [n]
                      const T* g,  // [n]
                      const T* u,  // [n]
                      std::size_t n);

// s = sigmoid(g): dgate = dh * u * s * (1 + g*(1-s));  dup = dh * g * s
template <class T>
void silu_mul_backward(T* dgate, T* dup,  // [n] each, overwritten
                       const T* dh, const T* g, const T* u, std::size_t n);

}  // namespace tspemu::ref
