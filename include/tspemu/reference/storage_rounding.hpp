// StorageRounding: the reference's precision policy as an object: where a tensor is stored in the
// policy's storage type, and so rounded to it. It defines "reference bf16" op by op.
//
// What: `store(p, n)` is called by the reference (model.cpp) and by the parallel schedules (the TSP
//   blocks) at every point where a tensor is stored; with bf16 storage it rounds each float there
//   to the nearest bf16 (core/bf16.hpp, ties to even), with fp32 storage it does nothing. All
//   compute stays fp32 (the values are bf16-representable floats): GEMMs read bf16 operands and
//   accumulate in fp32 (= the sgemm kernel of bf16_gemm.hpp; its oneDNN kernel equals it up to
//   summation order), softmax / lse, RMSNorm statistics (rstd), RoPE and the loss in fp32.
//   Megatron-LM's `--bf16` policy (../shared/BF16-NOTES.md §1; docs/bf16.md).
// The rounding points of one layer (every other tensor, and every statistic, stays fp32):
//   caller   the weights the GEMMs read and the norm weights (a bf16 copy of the fp32 master),
//            the block inputs x and dy: the caller passes bf16-representable values
//   forward  xn = rmsnorm(x)                              -> bf16  (both blocks)
//            q, k, v = xn·Wᵀ                              -> bf16; q, k after RoPE -> bf16 again
//            att = attention core(q, k, v) (fp32 inside)  -> bf16  (lse stays fp32)
//            gate, up = xn·Wᵀ; h = silu(gate)·up          -> bf16 each
//            y = x + att·Woᵀ, y = x + h·W_downᵀ           -> bf16 once: the residual add is fused
//                                                           into the fp32 GEMM accumulation
//   backward datt = dy·Wo, dh = dy·W_down                 -> bf16
//            dq, dk, dv of the attention core             -> bf16; dq, dk after RoPE⁻¹ -> bf16
//            dgate, dup = silu_mul backward               -> bf16
//            dxn = Σ d·W over the block's projections     -> bf16 once (fp32 accumulation)
//            dx = rmsnorm backward(dxn) + dy              -> bf16 once
//   weight gradients: fp32, accumulated in fp32 (Megatron's main_grad), never rounded.
// A schedule that rounds at exactly these points (and sums across ranks only in fp32) differs from
//   the reference by summation order alone: the E = 0 case of docs/bf16.md's rule.
// Requirements: none. T = double ignores the policy: the fp64 oracle of a bf16 run is the double
//   reference on the same bf16-rounded weights and inputs, with no intermediate rounding.
// Guarantees: with fp32 storage (the default) store() touches nothing, so the fp32 and double
//   references are bitwise what they were without a policy.
// Cost: one pass over the tensor at each rounding point with bf16 storage; nothing with fp32.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "tspemu/core/bf16.hpp"
#include "tspemu/core/precision.hpp"

namespace tspemu::ref {

struct StorageRounding {
  NumType storage = NumType::fp32;

  static constexpr StorageRounding fp32() { return {}; }
  static constexpr StorageRounding bf16() { return {NumType::bf16}; }
  static constexpr StorageRounding of(const PrecisionPolicy& p) { return {p.storage}; }

  // True when store() rounds floats (bf16 storage).
  constexpr bool rounds() const { return storage == NumType::bf16; }

  // Stores p[0, n) in the storage type: rounds floats to bf16 under bf16 storage.
  template <class T>
  void store(T* p, std::size_t n) const {
    if constexpr (std::is_same_v<T, float>) {
      if (!rounds()) return;
      for (std::size_t i = 0; i < n; ++i) p[i] = round_to_bf16(p[i]);
    } else {
      (void)p;  // double: the oracle, never rounded
      (void)n;
    }
  }
  template <class T>
  void store(std::vector<T>& v) const {
    store(v.data(), v.size());
  }
};

}  // namespace tspemu::ref
