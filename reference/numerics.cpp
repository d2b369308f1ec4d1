#include "tspemu/reference/numerics.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <vector>

namespace tspemu::ref {

namespace {

constexpr double kEps32 = 0x1.0p-23;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Maps floats to integers so that adjacent floats are adjacent integers and order is kept.
std::int64_t ordered(float f) {
  const std::int32_t i = std::bit_cast<std::int32_t>(f);
  return i < 0 ? std::int64_t(std::numeric_limits<std::int32_t>::min()) - i : i;
}

template <class C>
ErrorStats measure_impl(std::span<const C> cand, std::span<const double> oracle) {
  ErrorStats s;
  s.count = cand.size();
  if (cand.size() != oracle.size()) {
    s.finite = false;
    s.max_abs = s.max_rel = kInf;
    s.max_ulp = std::numeric_limits<std::int64_t>::max();
    return s;
  }
  for (double o : oracle) s.oracle_max = std::max(s.oracle_max, std::fabs(o));
  const double rel_floor = kEps32 * s.oracle_max;
  for (std::size_t i = 0; i < cand.size(); ++i) {
    const double c = double(cand[i]), o = oracle[i];
    double abs_err = std::fabs(c - o);
    std::int64_t ulp = ulp_distance(float(c), float(o));
    if (!std::isfinite(c)) {
      s.finite = false;
      abs_err = kInf;
      ulp = std::numeric_limits<std::int64_t>::max();
    }
    const double denom = std::max(std::fabs(o), rel_floor);
    const double rel = abs_err == 0 ? 0 : (denom > 0 ? abs_err / denom : kInf);
    if (abs_err > s.max_abs || i == 0) {
      s.max_abs = abs_err;
      s.worst = i;
      s.worst_candidate = c;
      s.worst_oracle = o;
    }
    s.max_rel = std::max(s.max_rel, rel);
    s.max_ulp = std::max(s.max_ulp, ulp);
  }
  return s;
}

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

}  // namespace

std::int64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<std::int64_t>::max();
  const std::int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

ErrorStats measure(std::span<const float> candidate, std::span<const double> oracle) {
  return measure_impl(candidate, oracle);
}
ErrorStats measure(std::span<const double> candidate, std::span<const double> oracle) {
  return measure_impl(candidate, oracle);
}

std::string ErrorStats::to_string() const {
  if (count == 0) return "empty";
  return format("max_abs=%.3e at [%zu] (cand=%.9g, oracle=%.9g) max_rel=%.3e max_ulp=%lld%s",
                max_abs, worst, worst_candidate, worst_oracle, max_rel, (long long)max_ulp,
                finite ? "" : " NON-FINITE/SIZE-MISMATCH");
}

double default_tiny(std::span<const double> oracle, double tiny_ulps) {
  double m = 0;
  for (double o : oracle) m = std::max(m, std::fabs(o));
  return tiny_ulps * kEps32 * m;
}

Verdict check_close(std::string_view name, std::span<const float> candidate,
                    std::span<const float> reference32, std::span<const double> oracle, double k,
                    double tiny) {
  Verdict v;
  v.candidate = measure(candidate, oracle);
  v.reference = measure(reference32, oracle);
  if (tiny < 0) tiny = default_tiny(oracle);
  v.bound = k * v.reference.max_abs + tiny;
  v.ok = v.candidate.finite && v.reference.finite && v.candidate.max_abs <= v.bound;
  v.report = format(
      "%.*s: %s candidate %s | reference32 max_abs=%.3e | bound k*ref+tiny = "
      "%g*%.3e+%.3e = %.3e (oracle max %.3e, n=%zu)",
      int(name.size()), name.data(), v.ok ? "PASS" : "FAIL", v.candidate.to_string().c_str(),
      v.reference.max_abs, k, v.reference.max_abs, tiny, v.bound, v.candidate.oracle_max,
      v.candidate.count);
  return v;
}

Verdict check_close_rounded(std::string_view name, std::span<const float> candidate,
                            std::span<const float> reference, std::span<const double> oracle,
                            double k, double u, double E, double tiny) {
  if (!(u >= 0) || !(E >= 0))
    throw std::invalid_argument(format("check_close_rounded %.*s: u=%g and E=%g must be >= 0",
                                       int(name.size()), name.data(), u, E));
  Verdict v = check_close(name, candidate, reference, oracle, k, tiny);
  if (E == 0) return v;
  if (tiny < 0) tiny = default_tiny(oracle);
  v.bound = k * v.reference.max_abs + u * E + tiny;
  v.ok = v.candidate.finite && v.reference.finite && v.candidate.max_abs <= v.bound;
  v.report = format(
      "%.*s: %s candidate %s | reference max_abs=%.3e | bound k*ref+u*E+tiny = "
      "%g*%.3e+%g*%.3e+%.3e = %.3e (oracle max %.3e, n=%zu)",
      int(name.size()), name.data(), v.ok ? "PASS" : "FAIL", v.candidate.to_string().c_str(),
      v.reference.max_abs, k, v.reference.max_abs, u, E, tiny, v.bound, v.candidate.oracle_max,
      v.candidate.count);
  return v;
}

double quantile_error(std::span<const float> candidate, std::span<const double> oracle, double q) {
  if (candidate.size() != oracle.size()) return kInf;
  if (candidate.empty()) return 0;
  std::vector<double> err(candidate.size());
  for (std::size_t i = 0; i < err.size(); ++i) {
    const double c = double(candidate[i]);
    err[i] = std::isfinite(c) ? std::fabs(c - oracle[i]) : kInf;
  }
  const auto at = static_cast<std::size_t>(std::clamp(q, 0.0, 1.0) * double(err.size() - 1));
  std::nth_element(err.begin(), err.begin() + static_cast<std::ptrdiff_t>(at), err.end());
  return err[at];
}

Verdict check_close_quantile(std::string_view name, std::span<const float> candidate,
                             std::span<const float> reference32, std::span<const double> oracle,
                             double k, double q, double tiny) {
  Verdict v;
  v.candidate = measure(candidate, oracle);
  v.reference = measure(reference32, oracle);
  if (tiny < 0) tiny = default_tiny(oracle);
  const double cq = quantile_error(candidate, oracle, q);
  const double rq = quantile_error(reference32, oracle, q);
  v.bound = k * rq + tiny;
  v.ok = v.candidate.finite && v.reference.finite && cq <= v.bound;
  v.report = format(
      "%.*s: %s candidate q%g=%.3e (%s) | reference32 q%g=%.3e max_abs=%.3e | bound k*ref_q+tiny "
      "= %g*%.3e+%.3e = %.3e (oracle max %.3e, n=%zu)",
      int(name.size()), name.data(), v.ok ? "PASS" : "FAIL", q, cq, v.candidate.to_string().c_str(),
      q, rq, v.reference.max_abs, k, rq, tiny, v.bound, v.candidate.oracle_max, v.candidate.count);
  return v;
}

Verdict check_close64(std::string_view name, std::span<const double> candidate,
                      std::span<const double> oracle, double rtol, double atol) {
  Verdict v;
  v.candidate = measure(candidate, oracle);
  v.bound = rtol * v.candidate.oracle_max + atol;
  v.ok = v.candidate.finite && v.candidate.max_abs <= v.bound;
  v.report = format("%.*s: %s %s | bound rtol*max|oracle|+atol = %.3e (n=%zu)", int(name.size()),
                    name.data(), v.ok ? "PASS" : "FAIL", v.candidate.to_string().c_str(), v.bound,
                    v.candidate.count);
  return v;
}

}  // namespace tspemu::ref
