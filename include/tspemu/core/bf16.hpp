// bf16: the bfloat16 storage type (1 sign, 8 exponent, 7 stored mantissa bits: the upper half of
// an IEEE fp32), and its conversions to and from float.
//
// What: a value type holding the 16 bits, for tensors stored in bf16 (weights, activations, KV
//   cache and wire buffers of a bf16 mixed-precision run). It has no arithmetic: compute widens to
//   float (to_float, exact), works in fp32 and rounds back once (bf16::from_float).
// Requirements: none (any float, any 16-bit pattern).
// Guarantees: from_float rounds to nearest, ties to even, as IEEE 754 roundTiesToEven does for a
//   binary format with 8 significant bits: finite values beyond the largest bf16 by at least half
//   an ulp (>= 0x1.ffp127) become ±infinity; fp32 subnormals round like normals (no flush to zero);
//   ±0 and ±infinity keep their sign. A NaN stays a NaN with its sign and its top 7 payload bits,
//   quieted (a signalling NaN whose payload sits only in the low 16 bits would otherwise truncate
//   to infinity). to_float is exact, so from_float(to_float(b)) == b for every non-NaN b; this is
//   what lets a bf16 GEMM be written as an fp32 GEMM of the widened inputs. The unit roundoff of
//   one from_float is bf16_unit_roundoff (2^-8): |to_float(from_float(x)) - x| <= 2^-8 |x| for x
//   in the normal range.
// Layout: sizeof(bf16) == 2, trivially copyable, so a bf16 array is the raw bit array oneDNN's
//   bf16 GEMM and a safetensors "BF16" tensor use.
// Cost: a few integer operations per conversion, constexpr.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace tspemu {

struct bf16 {
  std::uint16_t bits = 0;

  // The bf16 nearest x (ties to even); NaN stays a quiet NaN.
  static constexpr bf16 from_float(float x) noexcept {
    const auto u = std::bit_cast<std::uint32_t>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep sign and top payload bits, set the quiet bit
      return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
    // Adding 0x7fff rounds half down; the kept low bit makes ties go up only from an odd
    // mantissa. A carry out of the mantissa increments the exponent, which is the correctly
    // rounded result (up to infinity past the largest finite value).
    const std::uint32_t lsb = (u >> 16) & 1u;
    return bf16{static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16)};
  }

  // The bf16 whose bits are `b` (no rounding).
  static constexpr bf16 from_bits(std::uint16_t b) noexcept { return bf16{b}; }

  // Exact widening: the fp32 with these 16 bits on top and zeros below.
  constexpr float to_float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }

  friend constexpr bool operator==(const bf16&, const bf16&) noexcept = default;
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);

// Unit roundoff of one rounding to bf16 (8 significant bits): 2^-8.
inline constexpr double bf16_unit_roundoff = 1.0 / 256;

// x rounded to bf16 and widened back: the value a bf16 store of x holds.
constexpr float round_to_bf16(float x) noexcept {
  return bf16::from_float(x).to_float();
}

}  // namespace tspemu
