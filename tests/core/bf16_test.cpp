// The bf16 storage type (core/bf16.hpp): rounding to nearest with ties to even checked against an
// independent oracle (the two neighbouring bf16 values compared in double) at every bf16 value's
// ties and near-ties, subnormals, the overflow threshold, infinities and NaNs; widening is exact.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "tspemu/core/bf16.hpp"

namespace tspemu {
namespace {

static_assert(bf16::from_float(1.0f).bits == 0x3f80);
static_assert(bf16::from_bits(0xc000).to_float() == -2.0f);
static_assert(round_to_bf16(1.0f + 1.0f / 128) == 1.0f + 1.0f / 128);

std::uint16_t rounded(std::uint32_t float_bits) {
  return bf16::from_float(std::bit_cast<float>(float_bits)).bits;
}

// The value of a bf16 bit pattern in double, with 0x7f80 read as 2^128: the next value after the
// largest finite one if the exponent were unbounded, which is where IEEE rounding overflows.
double unbounded_value(std::uint16_t bits) {
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const unsigned exp = (bits >> 7) & 0xffu, man = bits & 0x7fu;
  if (exp == 0) return sign * std::ldexp(static_cast<double>(man), -133);  // 2^-126 · man/128
  return sign * std::ldexp(128.0 + man, static_cast<int>(exp) - 134);      // 2^(exp-127) · 1.man
}

// The correctly rounded bf16 of a finite float, by comparing the distances to its two bf16
// neighbours (truncation toward zero, and one step away from zero) in double, exact here.
std::uint16_t oracle(std::uint32_t float_bits) {
  const double x = static_cast<double>(std::bit_cast<float>(float_bits));
  const auto toward_zero = static_cast<std::uint16_t>(float_bits >> 16);
  if ((float_bits & 0xffffu) == 0) return toward_zero;
  const auto away = static_cast<std::uint16_t>(toward_zero + 1);  // magnitude bits + 1
  const double d_toward = std::abs(x - unbounded_value(toward_zero));
  const double d_away = std::abs(unbounded_value(away) - x);
  if (d_toward != d_away) return d_toward < d_away ? toward_zero : away;
  return (toward_zero & 1u) == 0 ? toward_zero : away;  // tie: the even mantissa
}

TEST(Bf16, EveryValueWidensExactlyAndRoundsBackToItself) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = bf16::from_bits(bits).to_float();
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f), b << 16) << std::hex << b;
    if (std::isnan(f)) continue;  // NaNs: below
    ASSERT_EQ(bf16::from_float(f).bits, bits) << std::hex << b;
  }
}

// At every finite bf16 value v (subnormals and both signs included): the float just above v, the
// tie halfway to the next one, and the floats on either side of the tie.
TEST(Bf16, RoundsToNearestTiesToEvenAgainstTheOracleAtEveryValue) {
  int checked = 0;
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    if (((b >> 7) & 0xffu) == 0xffu) continue;  // infinities and NaNs
    for (std::uint32_t low : {0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const std::uint32_t u = (b << 16) | low;
      ASSERT_EQ(rounded(u), oracle(u)) << std::hex << "float bits 0x" << u;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 5 * (0x10000 - 2 * 0x80));  // all but the 2 x 128 with exponent 0xff
}

TEST(Bf16, RoundsToNearestAgainstTheOracleOnAStrideThroughAllFloats) {
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 4093) {  // ~1M floats, every exponent
    const auto bits = static_cast<std::uint32_t>(u);
    if ((bits & 0x7f800000u) == 0x7f800000u) continue;
    ASSERT_EQ(rounded(bits), oracle(bits)) << std::hex << "float bits 0x" << bits;
  }
}

TEST(Bf16, TiesGoToTheEvenMantissa) {
  EXPECT_EQ(rounded(0x3f808000u), 0x3f80);  // 1 + 2^-8: halfway between 1 and 1 + 2^-7 -> 1
  EXPECT_EQ(rounded(0x3f818000u), 0x3f82);  // halfway between odd 0x3f81 and 0x3f82 -> up
  EXPECT_EQ(rounded(0xbf818000u), 0xbf82);  // same, negative: magnitude up
  EXPECT_EQ(rounded(0x3f807fffu), 0x3f80);  // just below the tie: down
  EXPECT_EQ(rounded(0x3f808001u), 0x3f81);  // just above the tie: up
  EXPECT_EQ(rounded(0x3fff8000u), 0x4000);  // mantissa carry into the exponent: 1.99.. -> 2
}

TEST(Bf16, SubnormalsRoundLikeNormalsWithoutFlushToZero) {
  EXPECT_EQ(rounded(0x00008000u), 0x0000);  // tie at the smallest subnormal: even (+0)
  EXPECT_EQ(rounded(0x00008001u), 0x0001);  // above it: the smallest bf16 subnormal
  EXPECT_EQ(rounded(0x00018000u), 0x0002);  // tie from odd 0x0001: up
  EXPECT_EQ(rounded(0x0000ffffu), 0x0001);
  EXPECT_EQ(rounded(0x007fffffu), 0x0080);  // largest fp32 subnormal -> smallest bf16 normal
  EXPECT_EQ(rounded(0x807f8000u), 0x8080);  // negative tie from odd 0x807f -> -smallest normal
  EXPECT_EQ(bf16::from_bits(0x0001).to_float(), std::ldexp(1.0f, -133));
  EXPECT_EQ(rounded(0x00000001u), 0x0000);  // 2^-149 -> +0
  EXPECT_EQ(rounded(0x80000001u), 0x8000);  // -2^-149 -> -0
}

TEST(Bf16, LargestFiniteAndOverflowToInfinity) {
  const float max_bf16 = bf16::from_bits(0x7f7f).to_float();
  EXPECT_EQ(max_bf16, std::ldexp(255.0f, 120));  // (2 - 2^-7) · 2^127
  EXPECT_EQ(rounded(0x7f7f7fffu), 0x7f7f);       // below half an ulp past it
  EXPECT_EQ(rounded(0x7f7f8000u), 0x7f80);       // exactly half (odd): +inf
  EXPECT_EQ(rounded(0xff7f8000u), 0xff80);       // -inf
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(bf16::from_float(-std::numeric_limits<float>::max()).bits, 0xff80);
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(bf16::from_float(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_EQ(bf16::from_float(0.0f).bits, 0x0000);
  EXPECT_EQ(bf16::from_float(-0.0f).bits, 0x8000);
}

TEST(Bf16, NaNStaysAQuietNaNWithItsSignAndTopPayload) {
  // Payload only in the low 16 bits: plain rounding would give +inf (0x7f80).
  EXPECT_EQ(rounded(0x7f800001u), 0x7fc0);
  EXPECT_EQ(rounded(0xff800001u), 0xffc0);
  EXPECT_EQ(rounded(0x7fffffffu), 0x7fff);  // all-ones payload: no carry into the sign
  EXPECT_EQ(rounded(0x7fc00000u), 0x7fc0);  // the default quiet NaN
  EXPECT_EQ(rounded(0x7fa12345u), 0x7fe1);  // signalling, top payload 0x21 kept, quieted
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    if (((b >> 7) & 0xffu) != 0xffu || (b & 0x7fu) == 0) continue;  // NaN bf16 patterns only
    const auto bits = static_cast<std::uint16_t>(b);
    const auto quiet = static_cast<std::uint16_t>(b | 0x0040u);
    EXPECT_EQ(bf16::from_float(bf16::from_bits(bits).to_float()).bits, quiet) << std::hex << b;
  }
}

TEST(Bf16, OneRoundingIsWithinTheUnitRoundoff) {
  for (std::uint64_t u = 0x00800000u; u < 0x7f7f8000u; u += 65537) {  // normal range, positive
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(u));
    const double err = std::abs(static_cast<double>(round_to_bf16(x)) - x);
    ASSERT_LE(err, bf16_unit_roundoff * x) << x;
  }
}

}  // namespace
}  // namespace tspemu
