// Shared helpers for the reference tests: small configs, deterministic random data, and a
// central-difference gradient checker.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model_config.hpp"

namespace tspemu::ref::testing {

// GQA (NH=4 over NKV=2), RoPE with a non-default base, untied head; hs=4.
inline ModelConfig tiny_gqa_config() {
  ModelConfig c;
  c.vocab = 13;
  c.hidden = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn = 24;
  c.rope_base = 500.0;
  c.norm_eps = 1e-5;
  c.tie_embeddings = false;
  return c;
}

// The PyTorch cross-checks' model (conformance_test.cpp, decode_torch_test.cpp): tiny_gqa_config
// widened to hs=8, V=37, F=48.
inline ModelConfig torch_gqa_config() {
  ModelConfig c = tiny_gqa_config();
  c.vocab = 37;
  c.hidden = 32;
  c.ffn = 48;
  return c;
}

inline ModelConfig tiny_tied_config() {
  ModelConfig c = tiny_gqa_config();
  c.n_kv_heads = 4;
  c.tie_embeddings = true;
  c.rope_base = 10000.0;
  return c;
}

inline std::vector<double> random_vector(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<double> v = normal_stream(seed, "test", n);
  for (double& x : v) x *= scale;
  return v;
}

inline std::vector<std::int32_t> random_tokens(std::size_t n, int vocab, std::uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = std::int32_t(rng.next() % std::uint64_t(vocab));
  return t;
}

// Central differences in double. h = 1e-5 (about cbrt(eps)): truncation error h²/6·|f'''| plus
// rounding eps·|f|/h are both ~1e-10 for these O(1) losses, so the tolerance
// 1e-7 + 1e-6·|g| leaves three orders of magnitude of margin while any real bug (a wrong term,
// a missing factor) shows up at O(|g|).
struct GradCheck {
  double h = 1e-5;
  double atol = 1e-7;
  double rtol = 1e-6;
  std::size_t max_checks = 0;  // 0: every element; else an evenly spread subset

  // Checks analytic[i] == d loss / d param[i]; param is perturbed and restored.
  void run(const std::string& name, std::vector<double>& param, const std::vector<double>& analytic,
           const std::function<double()>& loss) const {
    ASSERT_EQ(param.size(), analytic.size()) << name;
    const std::size_t n = param.size();
    const std::size_t stride =
        (max_checks == 0 || n <= max_checks) ? 1 : (n + max_checks - 1) / max_checks;
    int failures = 0;
    for (std::size_t i = 0; i < n; i += stride) {
      const double saved = param[i];
      param[i] = saved + h;
      const double up = loss();
      param[i] = saved - h;
      const double down = loss();
      param[i] = saved;
      const double fd = (up - down) / (2 * h);
      const double tol = atol + rtol * std::fabs(analytic[i]);
      if (std::fabs(fd - analytic[i]) > tol && ++failures <= 5) {
        ADD_FAILURE() << name << "[" << i << "]: analytic " << analytic[i] << " vs central "
                      << "difference " << fd << " (|diff| " << std::fabs(fd - analytic[i])
                      << " > tol " << tol << ")";
      }
    }
    EXPECT_EQ(failures, 0) << name << ": " << failures << " mismatching elements";
  }
};

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// A reference block only reorders sums (blocks merged by lse, shards accumulated one after
// another), so its error against the oracle is of the one-shot reference's order; 3 is the factor
// the parallel blocks use, and a real bug (a wrong statistic, a lost block) is orders of magnitude
// larger.
constexpr double kOracleFactor = 3.0;

// Against PyTorch: our fp32 error may be this many times PyTorch's fp32 error. Both use
// OpenBLAS-class GEMMs in fp32; the factor absorbs rounding luck on small tensors (observed
// ratios: docs/design/numerics.md).
constexpr double kTorchFp32K = 4.0;
// Against PyTorch in double: far above what is observed (docs/design/numerics.md).
constexpr double kTorchFp64Rtol = 1e-12;

// The doubles of x as T.
template <class T>
std::vector<T> as(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

}  // namespace tspemu::ref::testing
