// exp_poly (the float kernels' vectorized exp) against exp in double, and the float kernels that
// use it (attention's softmax rows, SiLU) against the fp64 oracle and against their per-element
// std::exp form.
#include "tspemu/reference/exp_poly.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/silu_mul.hpp"

namespace tspemu::ref {
namespace {

using testing::random_vector;

std::vector<float> to_float(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

TEST(ExpPoly, WithinOneUlpOfCorrectlyRoundedExpOverTheWholeFiniteRange) {
  // Every 97th bit pattern of [-120, 95] (both signs; ~22M values), subnormal results included.
  std::int64_t worst = 0;
  float worst_x = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffULL; u += 97) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(u));
    if (!(x >= -120.0f && x <= 95.0f)) continue;
    const float expect = static_cast<float>(std::exp(static_cast<double>(x)));
    const std::int64_t d = ulp_distance(exp_poly(x), expect);
    if (d > worst) {
      worst = d;
      worst_x = x;
    }
  }
  EXPECT_LE(worst, 1) << "at x = " << worst_x;
}

TEST(ExpPoly, EdgesGiveZeroInfinityNanAndExactOne) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_poly(0.0f), 1.0f);
  EXPECT_EQ(exp_poly(-0.0f), 1.0f);
  EXPECT_EQ(exp_poly(-inf), 0.0f);
  EXPECT_EQ(exp_poly(-104.0f), 0.0f);
  EXPECT_EQ(exp_poly(-1e30f), 0.0f);
  EXPECT_EQ(exp_poly(inf), inf);
  EXPECT_EQ(exp_poly(88.8f), inf);
  EXPECT_EQ(exp_poly(1e30f), inf);
  EXPECT_TRUE(std::isfinite(exp_poly(88.72f)));
  EXPECT_TRUE(std::isnan(exp_poly(std::numeric_limits<float>::quiet_NaN())));
}

TEST(ExpPoly, ALanesResultDoesNotDependOnItsLaneOrNeighbours) {
  const f32x4 v = exp_poly(f32x4{-3.25f, 0.5f, 11.0f, -80.0f});
  const f32x4 w = exp_poly(f32x4{11.0f, -80.0f, -3.25f, 0.5f});
  EXPECT_EQ(std::bit_cast<std::uint32_t>(v[0]), std::bit_cast<std::uint32_t>(w[2]));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(v[1]), std::bit_cast<std::uint32_t>(w[3]));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(v[2]), std::bit_cast<std::uint32_t>(w[0]));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(v[3]), std::bit_cast<std::uint32_t>(exp_poly(-80.0f)));
}

// The float SiLU (exp_poly, four at a time) against the oracle with the rule's k = 2, the
// per-element std::exp form being the fp32 reference; every length 1..9 (each tail) gives each
// element the same bits as the longest run.
TEST(SiluMul, Fp32KernelIsWithinTheOracleRuleAndIndependentOfLength) {
  const std::size_t n = 9;
  const auto g64 = random_vector(n, 31, 4.0), u64 = random_vector(n, 32),
             dh64 = random_vector(n, 33);
  const auto g = to_float(g64), u = to_float(u64), dh = to_float(dh64);
  std::vector<double> h64(n), dg64(n), du64(n);
  silu_mul_forward(h64.data(), g64.data(), u64.data(), n);
  silu_mul_backward(dg64.data(), du64.data(), dh64.data(), g64.data(), u64.data(), n);
  std::vector<float> h(n), dg(n), du(n), h_std(n), dg_std(n), du_std(n);
  silu_mul_forward(h.data(), g.data(), u.data(), n);
  silu_mul_backward(dg.data(), du.data(), dh.data(), g.data(), u.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    h_std[i] = g[i] * s * u[i];
    dg_std[i] = dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    du_std[i] = dh[i] * g[i] * s;
  }
  for (const auto& [name, cand, ref32, oracle] :
       {std::tuple{"h", &h, &h_std, &h64}, std::tuple{"dgate", &dg, &dg_std, &dg64},
        std::tuple{"dup", &du, &du_std, &du64}}) {
    const Verdict v = check_close(name, *cand, *ref32, *oracle, 2.0);
    EXPECT_TRUE(v) << v.report;
  }
  for (std::size_t len = 1; len < n; ++len) {
    std::vector<float> hl(len), dgl(len), dul(len);
    silu_mul_forward(hl.data(), g.data(), u.data(), len);
    silu_mul_backward(dgl.data(), dul.data(), dh.data(), g.data(), u.data(), len);
    for (std::size_t i = 0; i < len; ++i) {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(hl[i]), std::bit_cast<std::uint32_t>(h[i])) << len;
      EXPECT_EQ(std::bit_cast<std::uint32_t>(dgl[i]), std::bit_cast<std::uint32_t>(dg[i])) << len;
      EXPECT_EQ(std::bit_cast<std::uint32_t>(dul[i]), std::bit_cast<std::uint32_t>(du[i])) << len;
    }
  }
}

// Float attention with ascending key positions takes the prefix rows (exp_poly, lane sums); the
// same keys in descending order take the per-element rows (std::exp, index-order sums) and give
// the same function. Against the oracle, the prefix rows must be as good as the per-element
// ones under the rule (k = 2), forward and backward (one-shot and with a given delta).
TEST(Attention, Fp32PrefixRowsAreAsAccurateAsThePerElementRows) {
  const AttentionDims d{1, 37, 150, 4, 2, 16};  // tails: 37 queries, 150 keys, odd prefixes
  std::vector<std::int64_t> qpos(d.Tq), kpos(d.Tk), kpos_rev(d.Tk);
  for (int i = 0; i < d.Tq; ++i) qpos[i] = 3 * i + 20;
  for (int j = 0; j < d.Tk; ++j) kpos[j] = j;
  const auto q64 = random_vector(std::size_t(d.Tq) * d.NH * d.hs, 41, 2.0);
  const auto k64 = random_vector(std::size_t(d.Tk) * d.NKV * d.hs, 42, 2.0);
  const auto v64 = random_vector(k64.size(), 43);
  const auto do64 = random_vector(q64.size(), 44);
  // The descending copy of K/V and their positions.
  const std::size_t row = std::size_t(d.NKV) * d.hs;
  std::vector<double> k64_rev(k64.size()), v64_rev(v64.size());
  for (int j = 0; j < d.Tk; ++j) {
    kpos_rev[j] = kpos[d.Tk - 1 - j];
    for (std::size_t c = 0; c < row; ++c) {
      k64_rev[j * row + c] = k64[(d.Tk - 1 - j) * row + c];
      v64_rev[j * row + c] = v64[(d.Tk - 1 - j) * row + c];
    }
  }
  const auto q = to_float(q64), k = to_float(k64), v = to_float(v64), dout = to_float(do64);
  const auto k_rev = to_float(k64_rev), v_rev = to_float(v64_rev);

  std::vector<double> out64(q64.size()), lse64(std::size_t(d.NH) * d.Tq);
  causal_attention_forward(out64.data(), lse64.data(), q64.data(), k64.data(), v64.data(),
                           qpos.data(), kpos.data(), d);
  std::vector<float> out(q.size()), lse(lse64.size()), out_rev(q.size()), lse_rev(lse64.size());
  causal_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), qpos.data(),
                           kpos.data(), d);
  causal_attention_forward(out_rev.data(), lse_rev.data(), q.data(), k_rev.data(), v_rev.data(),
                           qpos.data(), kpos_rev.data(), d);
  EXPECT_TRUE(check_close("out", out, out_rev, out64, 2.0)) << "forward";
  EXPECT_TRUE(check_close("lse", lse, lse_rev, lse64, 2.0)) << "forward";

  std::vector<double> delta64(lse64.size());
  attention_row_delta(delta64.data(), do64.data(), out64.data(), d);
  const auto delta = to_float(delta64);
  for (const bool given_delta : {false, true}) {
    std::vector<double> dq64(q64.size()), dk64(k64.size()), dv64(v64.size());
    causal_attention_backward(dq64.data(), dk64.data(), dv64.data(), do64.data(), q64.data(),
                              k64.data(), v64.data(), lse64.data(), qpos.data(), kpos.data(), d,
                              given_delta ? delta64.data() : nullptr);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<float> dq_rev(q.size()), dk_rev(k.size()), dv_rev(v.size());
    causal_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                              v.data(), lse.data(), qpos.data(), kpos.data(), d,
                              given_delta ? delta.data() : nullptr);
    causal_attention_backward(dq_rev.data(), dk_rev.data(), dv_rev.data(), dout.data(), q.data(),
                              k_rev.data(), v_rev.data(), lse_rev.data(), qpos.data(),
                              kpos_rev.data(), d, given_delta ? delta.data() : nullptr);
    // Back to ascending order for the comparison.
    std::vector<float> dk_asc(dk.size()), dv_asc(dv.size());
    for (int j = 0; j < d.Tk; ++j)
      for (std::size_t c = 0; c < row; ++c) {
        dk_asc[j * row + c] = dk_rev[(d.Tk - 1 - j) * row + c];
        dv_asc[j * row + c] = dv_rev[(d.Tk - 1 - j) * row + c];
      }
    for (const auto& [name, cand, ref32, oracle] :
         {std::tuple{"dq", &dq, &dq_rev, &dq64}, std::tuple{"dk", &dk, &dk_asc, &dk64},
          std::tuple{"dv", &dv, &dv_asc, &dv64}}) {
      const Verdict verdict = check_close(name, *cand, *ref32, *oracle, 2.0);
      EXPECT_TRUE(verdict) << verdict.report << (given_delta ? " (delta given)" : "");
    }
  }
}

}  // namespace
}  // namespace tspemu::ref
