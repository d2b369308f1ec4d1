#include "tspemu/reference/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tspemu::ref {

namespace {

template <class T>
void require_no_nan(const T* row, int n, int seq) {
  for (int i = 0; i < n; ++i) {
    if (std::isnan(row[i])) {
      throw std::domain_error("Sampler: logits[" + std::to_string(seq) + ", " + std::to_string(i) +
                              "] is NaN");
    }
  }
}

}  // namespace

Sampler Sampler::greedy() {
  return Sampler(true, 0, 1.0, 0);
}

Sampler Sampler::seeded(std::uint64_t seed, double temperature, int top_k) {
  if (!std::isfinite(temperature) || temperature <= 0) {
    std::ostringstream s;
    s << "Sampler: temperature=" << temperature
      << " must be finite and > 0 (use Sampler::greedy() for argmax)";
    throw std::invalid_argument(s.str());
  }
  if (top_k < 0) {
    throw std::invalid_argument("Sampler: top_k=" + std::to_string(top_k) +
                                " must be >= 0 (0: all tokens)");
  }
  return Sampler(false, seed, temperature, top_k);
}

template <class T>
std::int32_t argmax_first(const T* row, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = i;  // strict: a tie keeps the lower index
  }
  return std::int32_t(best);
}

template <class T>
std::vector<std::int32_t> Sampler::sample(std::span<const T> logits, int B, int V) {
  if (B <= 0 || V <= 0 || logits.size() != std::size_t(B) * V) {
    throw std::invalid_argument("Sampler: logits of " + std::to_string(logits.size()) +
                                " elements for B=" + std::to_string(B) + " V=" + std::to_string(V) +
                                " (need B, V > 0 and B*V elements)");
  }
  std::vector<std::int32_t> tokens(B);
  std::vector<int> candidates;  // ascending token indices
  std::vector<double> weights;
  for (int b = 0; b < B; ++b) {
    const T* row = logits.data() + std::size_t(b) * V;
    require_no_nan(row, V, b);
    if (greedy_) {
      tokens[b] = argmax_first(row, V);
      continue;
    }
    candidates.resize(V);
    std::iota(candidates.begin(), candidates.end(), 0);
    if (top_k_ > 0 && top_k_ < V) {
      // The k best by (logit descending, index ascending), then back in index order.
      std::partial_sort(
          candidates.begin(), candidates.begin() + top_k_, candidates.end(),
          [row](int a, int c) { return row[a] > row[c] || (row[a] == row[c] && a < c); });
      candidates.resize(top_k_);
      std::sort(candidates.begin(), candidates.end());
    }
    double m = -INFINITY;
    for (const int i : candidates) m = std::max(m, double(row[i]));
    weights.resize(candidates.size());
    double total = 0;
    for (std::size_t j = 0; j < candidates.size(); ++j) {
      weights[j] = std::exp((double(row[candidates[j]]) - m) / temperature_);
      total += weights[j];
    }
    const double target = rng_.uniform() * total;
    ++draws_;
    std::size_t pick = candidates.size() - 1;
    double cum = 0;
    for (std::size_t j = 0; j < candidates.size(); ++j) {
      cum += weights[j];
      if (cum > target) {
        pick = j;
        break;
      }
    }
    tokens[b] = std::int32_t(candidates[pick]);
  }
  return tokens;
}

template std::int32_t argmax_first<float>(const float*, int);
template std::int32_t argmax_first<double>(const double*, int);
template std::vector<std::int32_t> Sampler::sample<float>(std::span<const float>, int, int);
template std::vector<std::int32_t> Sampler::sample<double>(std::span<const double>, int, int);

}  // namespace tspemu::ref
