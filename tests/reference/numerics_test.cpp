// The numerics helpers every later check relies on: ULP distance, error statistics, the
// acceptance rule and its report.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "tspemu/reference/numerics.hpp"

namespace tspemu::ref {
namespace {

using ::testing::HasSubstr;

TEST(Numerics, UlpDistanceCountsRepresentableFloats) {
  EXPECT_EQ(ulp_distance(1.0f, 1.0f), 0);
  EXPECT_EQ(ulp_distance(0.0f, -0.0f), 0);
  EXPECT_EQ(ulp_distance(1.0f, std::nextafter(1.0f, 2.0f)), 1);
  EXPECT_EQ(ulp_distance(std::nextafter(1.0f, 2.0f), 1.0f), 1);
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(ulp_distance(-tiny, tiny), 2);  // crossing zero counts the steps through it
  EXPECT_EQ(ulp_distance(1.0f, std::nanf("")), std::numeric_limits<std::int64_t>::max());
}

TEST(Numerics, MeasureReportsMaxErrorsAndWorstIndex) {
  const std::vector<double> oracle = {1.0, -2.0, 4.0, 0.0};
  const std::vector<float> cand = {1.0f, -2.0f + 0x1.0p-20f, 4.0f, 0.0f};
  const ErrorStats s = measure(cand, oracle);
  EXPECT_EQ(s.worst, 1u);
  EXPECT_DOUBLE_EQ(s.max_abs, 0x1.0p-20);
  EXPECT_DOUBLE_EQ(s.max_rel, 0x1.0p-21);
  EXPECT_EQ(s.max_ulp, 8);  // 2 - 2^-20 lies in [1, 2), where one fp32 ulp is 2^-23
  EXPECT_DOUBLE_EQ(s.oracle_max, 4.0);
  EXPECT_TRUE(s.finite);
}

TEST(Numerics, RelativeErrorIsFlooredNearZero) {
  const std::vector<double> oracle = {1.0, 0.0};
  const std::vector<float> cand = {1.0f, 1e-30f};
  const ErrorStats s = measure(cand, oracle);
  EXPECT_NEAR(s.max_rel, 1e-30 / 0x1.0p-23, 1e-30);  // floor = eps32 * max|oracle|
}

TEST(Numerics, NanOrSizeMismatchFailsEveryCheck) {
  const std::vector<double> oracle = {1.0, 2.0};
  const std::vector<float> nan = {1.0f, std::nanf("")};
  const std::vector<float> ok = {1.0f, 2.0f};
  EXPECT_FALSE(measure(nan, oracle).finite);
  EXPECT_FALSE(check_close("t", nan, ok, oracle));
  EXPECT_FALSE(check_close("t", ok, nan, oracle));
  const std::vector<float> short_one = {1.0f};
  EXPECT_FALSE(check_close("t", short_one, ok, oracle));
}

TEST(Numerics, RuleAcceptsWithinKTimesReferenceErrorAndRejectsBeyond) {
  const std::vector<double> oracle = {1.0, 1.0, 1.0, 1.0};
  const std::vector<float> ref32 = {1.0f + 0x1.0p-10f, 1.0f, 1.0f, 1.0f};
  const std::vector<float> good = {1.0f, 1.0f, 1.0f - 0x1.0p-9f, 1.0f};  // 2x reference
  const std::vector<float> bad = {1.0f, 1.0f, 1.0f, 1.0f + 0x1.0p-7f};   // 8x reference
  const Verdict g = check_close("layers.0.wq.grad", good, ref32, oracle, 2.0);
  EXPECT_TRUE(g) << g.report;
  const Verdict b = check_close("layers.0.wq.grad", bad, ref32, oracle, 2.0);
  EXPECT_FALSE(b);
  EXPECT_THAT(b.report, HasSubstr("layers.0.wq.grad"));
  EXPECT_THAT(b.report, HasSubstr("FAIL"));
  EXPECT_THAT(b.report, HasSubstr("at [3]"));
}

TEST(Numerics, TinyFloorIsFourFp32UlpsOfTheOracleMagnitude) {
  const std::vector<double> oracle = {0.5, -8.0};
  EXPECT_DOUBLE_EQ(default_tiny(oracle), 4 * 0x1.0p-23 * 8.0);
  // An exact reference does not make the rule demand exactness.
  const std::vector<float> exact = {0.5f, -8.0f};
  const std::vector<float> near = {0.5f, -8.0f + 0x1.0p-19f};  // 2^-19 = 2 ulps of 8
  EXPECT_TRUE(check_close("t", near, exact, oracle));
  const std::vector<float> far = {0.5f, -8.0f + 0x1.0p-15f};
  EXPECT_FALSE(check_close("t", far, exact, oracle));
}

TEST(Numerics, Fp64CheckUsesRelativeToleranceOfMagnitude) {
  const std::vector<double> oracle = {100.0, 1.0};
  const std::vector<double> cand = {100.0 + 1e-11, 1.0};
  EXPECT_TRUE(check_close64("t", cand, oracle, 1e-12));
  EXPECT_FALSE(check_close64("t", cand, oracle, 1e-14));
}

TEST(Numerics, QuantileRuleIgnoresAFewIllConditionedElementsButNotABlock) {
  // 200 elements: the reference is off by 1e-7 everywhere; the candidate by 1e-7 too, except
  // one element off by 1e-3 (an Adam step at |g| ~ eps) — or, second case, 20 of them (a block).
  std::vector<double> oracle(200, 0.5);
  std::vector<float> ref32(200), cand(200);
  for (std::size_t i = 0; i < 200; ++i) ref32[i] = cand[i] = static_cast<float>(0.5 + 1e-7);
  cand[17] = 0.501f;
  EXPECT_FALSE(check_close("w", cand, ref32, oracle, 3.0)) << "the max sees the one element";
  EXPECT_TRUE(check_close_quantile("w", cand, ref32, oracle, 3.0));
  for (std::size_t i = 40; i < 60; ++i) cand[i] = 0.501f;
  const Verdict v = check_close_quantile("w", cand, ref32, oracle, 3.0);
  EXPECT_FALSE(v) << v.report;
  EXPECT_NE(v.report.find("q0.99"), std::string::npos) << v.report;
  EXPECT_NEAR(quantile_error(cand, oracle, 0.99), 1e-3, 1e-6);
  EXPECT_EQ(quantile_error(std::vector<float>(3), oracle, 0.99), HUGE_VAL) << "size mismatch";
}

// The bf16 rule: err(candidate) <= k·err(reference) + u·E + tiny. With E = 0 it is check_close;
// an extra rounding of magnitude E admits at most u·E more, no more.
TEST(Numerics, RoundedRuleAdmitsExactlyUTimesTheRecordedMagnitude) {
  const std::vector<double> oracle = {4.0, 4.0, 4.0, 4.0};
  const std::vector<float> ref = {4.0f + 0x1.0p-8f, 4.0f, 4.0f, 4.0f};
  // One extra bf16 rounding of a value of magnitude 4 moves it by up to 2^-8 · 4 = 2^-6.
  const std::vector<float> rounded_once = {4.0f, 4.0f + 0x1.0p-6f + 3 * 0x1.0p-8f, 4.0f, 4.0f};
  const double u = 0x1.0p-8;
  const Verdict plain = check_close("y", rounded_once, ref, oracle, 3.0);
  const Verdict e0 = check_close_rounded("y", rounded_once, ref, oracle, 3.0, u, 0.0);
  EXPECT_FALSE(plain) << plain.report;
  EXPECT_EQ(e0.ok, plain.ok);
  EXPECT_EQ(e0.bound, plain.bound);
  const Verdict with_e = check_close_rounded("y", rounded_once, ref, oracle, 3.0, u, 4.0);
  EXPECT_TRUE(with_e) << with_e.report;
  EXPECT_THAT(with_e.report, HasSubstr("u*E"));
  EXPECT_DOUBLE_EQ(with_e.bound, plain.bound + u * 4.0);
  // Twice that error is beyond the bound the same E gives.
  const std::vector<float> doubled = {4.0f, 4.0f + 2 * (0x1.0p-6f + 3 * 0x1.0p-8f), 4.0f, 4.0f};
  EXPECT_FALSE(check_close_rounded("y", doubled, ref, oracle, 3.0, u, 4.0));
  EXPECT_THROW(check_close_rounded("y", doubled, ref, oracle, 3.0, u, -1.0), std::invalid_argument);
}

}  // namespace
}  // namespace tspemu::ref
