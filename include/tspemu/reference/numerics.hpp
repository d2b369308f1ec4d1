// Numerics helpers: judge a float result against the fp64 oracle.
//
// What: error statistics of a candidate tensor against the oracle (the double instantiation of
//   the same computation), and the acceptance rule used by every parallel-schedule check:
//       err(candidate fp32) <= k * err(reference fp32) + tiny
//   where err is the max absolute error against the oracle, "reference fp32" is the float
//   instantiation of the single-thread reference, and the candidate is e.g. a parallel schedule
//   in float. A parallel schedule only reorders sums, so its error should be of the same order as
//   the reference's; k (2 to 4 is typical) absorbs the luck of rounding.
// tiny: the rule's floor, for tensors the fp32 reference happens to get (almost) exact:
//       tiny = tiny_ulps * 2^-23 * max_i |oracle_i|        (default_tiny(), tiny_ulps = 4)
//   i.e. a few fp32 ulps at the tensor's largest magnitude. Pass tiny < 0 to use it.
// Definitions (per element i, o = oracle, c = candidate):
//   abs_i = |c - o|;  rel_i = abs_i / max(|o|, 2^-23 * max|o|)  (the floor keeps near-zero oracle
//   elements from dominating);  ulp_i = distance in fp32 steps between c and float(o) (ordered
//   integer mapping, so +0/-0 are 0 apart and crossing zero counts the steps through it).
//   A NaN or infinite candidate (or a size mismatch) makes every statistic infinite, i.e. fails.
// Guarantees: pure functions; no allocation beyond the report string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tspemu::ref {

struct ErrorStats {
  double max_abs = 0;        // max_i |c - o|
  double max_rel = 0;        // max_i rel_i (see above)
  std::int64_t max_ulp = 0;  // max_i fp32 ulp distance
  std::size_t worst = 0;     // index of max_abs
  double worst_candidate = 0;
  double worst_oracle = 0;
  double oracle_max = 0;  // max_i |o|
  std::size_t count = 0;
  bool finite = true;  // false: NaN/Inf in candidate, or size mismatch

  std::string to_string() const;  // "max_abs=.. at [i] (cand=.., oracle=..) max_rel=.. max_ulp=.."
};

ErrorStats measure(std::span<const float> candidate, std::span<const double> oracle);
ErrorStats measure(std::span<const double> candidate, std::span<const double> oracle);

// Distance in representable fp32 values between a and b (0 if equal, including +0/-0).
std::int64_t ulp_distance(float a, float b);

double default_tiny(std::span<const double> oracle, double tiny_ulps = 4.0);

struct Verdict {
  bool ok = false;
  ErrorStats candidate;  // candidate vs oracle
  ErrorStats reference;  // fp32 reference vs oracle
  double bound = 0;      // k * reference.max_abs + tiny
  std::string report;    // one line naming the tensor, PASS/FAIL, both errors, bound, worst index
  explicit operator bool() const { return ok; }
};

// The acceptance rule. Example:
//   auto v = check_close("layers.0.wq.grad", cand, ref32, oracle, /*k=*/2.0);
//   EXPECT_TRUE(v) << v.report;
Verdict check_close(std::string_view name, std::span<const float> candidate,
                    std::span<const float> reference32, std::span<const double> oracle,
                    double k = 2.0, double tiny = -1.0);

// The rule for a candidate that rounds to a narrower type (bf16) where the reference does not
// (docs/bf16.md):
//       err(candidate) <= k * err(reference) + u * E + tiny
// u: the narrower type's unit roundoff (bf16_unit_roundoff, 2^-8); E >= 0: the magnitude the
// candidate rounded where the reference does not, max_i Σ_j |v_ij| over those roundings j of
// element i, recorded by the code that rounds (E = 0: the rounding points coincide, and this is
// check_close). Each extra rounding moves a value by at most u·|v| (the standard model of
// floating-point rounding), which the reference's error does not contain; every shared rounding
// point is in both errors, which the k-term covers as in fp32.
Verdict check_close_rounded(std::string_view name, std::span<const float> candidate,
                            std::span<const float> reference, std::span<const double> oracle,
                            double k, double u, double E, double tiny = -1.0);

// The same rule on a high quantile of the element errors instead of their max:
//       quantile_q |candidate - oracle| <= k * quantile_q |reference32 - oracle| + tiny
// (q = 0.99: the error below which 99% of the elements lie; tiny as above). For tensors whose
// elements are conditioned very differently, where the max is an extreme value of a handful of
// elements and its ratio between two equally good fp32 runs is not bounded by a small k: weights
// after an Adam update, whose step lr·m̂/(sqrt(v̂) + eps) amplifies a gradient's rounding by up
// to lr/eps on the few elements with |g| ~ eps (1e6 at lr 1e-2, eps 1e-8). A schedule bug (a
// wrong shard, a missing or doubled partial sum, a misplaced update) moves whole rows or blocks,
// far more than 1% of a tensor, by O(lr), and fails it by orders of magnitude; an error confined
// to fewer than 1% of the elements passes (the max-abs rule on the gradients covers those).
// Verdict::candidate / reference keep their max statistics; the quantiles are in the report and
// in quantile_error().
Verdict check_close_quantile(std::string_view name, std::span<const float> candidate,
                             std::span<const float> reference32, std::span<const double> oracle,
                             double k = 2.0, double q = 0.99, double tiny = -1.0);
// The q-quantile of |candidate_i - oracle_i| (infinite for a size mismatch or a non-finite
// candidate).
double quantile_error(std::span<const float> candidate, std::span<const double> oracle, double q);

// A fixed-tolerance check for fp64 vs fp64 comparisons (e.g. against PyTorch float64):
//   max_abs <= rtol * max|oracle| + atol.
Verdict check_close64(std::string_view name, std::span<const double> candidate,
                      std::span<const double> oracle, double rtol, double atol = 0.0);

}  // namespace tspemu::ref
