#include "tspemu/reference/init.hpp"

#include <cmath>
#include <numbers>

namespace tspemu::ref {

std::uint64_t SplitMix64::next() {
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double SplitMix64::uniform() {
  // (k + 0.5) / 2^53 for k in [0, 2^53): strictly inside (0, 1), so log(u) is finite.
  return (double(next() >> 11) + 0.5) * 0x1.0p-53;
}

double SplitMix64::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = uniform(), u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(a);
  has_spare_ = true;
  return r * std::cos(a);
}

std::uint64_t fnv1a64(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::vector<double> normal_stream(std::uint64_t seed, std::string_view name, std::size_t n) {
  SplitMix64 seeder(seed ^ fnv1a64(name));
  SplitMix64 rng(seeder.next());
  std::vector<double> out(n);
  for (double& x : out) x = rng.normal();
  return out;
}

template <class T>
ModelWeights<T> init_weights(const ModelConfig& cfg, std::uint64_t seed) {
  ModelWeights<T> w = ModelWeights<T>::zeros(cfg);
  for (auto& p : parameters(w)) {
    const std::vector<double> z = normal_stream(seed, p.name, p.data->size());
    const bool is_norm = p.shape.size() == 1;
    // Linear [out, in]: 1/sqrt(in). Tables [V, C]: 1/sqrt(C), the same number.
    const double stddev = is_norm ? 0.1 : 1.0 / std::sqrt(double(p.shape[1]));
    for (std::size_t i = 0; i < z.size(); ++i) {
      (*p.data)[i] = T((is_norm ? 1.0 : 0.0) + stddev * z[i]);
    }
  }
  return w;
}

template <class To, class From>
ModelWeights<To> convert_weights(const ModelWeights<From>& w) {
  ModelWeights<To> out = ModelWeights<To>::zeros(w.config);
  auto src = parameters(w);
  auto dst = parameters(out);
  for (std::size_t i = 0; i < src.size(); ++i) {
    const auto& s = *src[i].data;
    auto& d = *dst[i].data;
    for (std::size_t j = 0; j < s.size(); ++j) d[j] = To(s[j]);
  }
  return out;
}

template ModelWeights<float> init_weights<float>(const ModelConfig&, std::uint64_t);
template ModelWeights<double> init_weights<double>(const ModelConfig&, std::uint64_t);
template ModelWeights<float> convert_weights<float, double>(const ModelWeights<double>&);
template ModelWeights<double> convert_weights<double, float>(const ModelWeights<float>&);
template ModelWeights<float> convert_weights<float, float>(const ModelWeights<float>&);
template ModelWeights<double> convert_weights<double, double>(const ModelWeights<double>&);

}  // namespace tspemu::ref
