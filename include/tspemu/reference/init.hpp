// Deterministic initialisation: a config plus a seed fully determines a model.
//
// Generator: SplitMix64 (Steele, Lea, Flood 2014; the seeding generator of xoshiro). Each tensor
//   draws from its own stream, seeded with splitmix64(seed ^ fnv1a64(tensor name)), so a tensor's
//   values depend only on (seed, name, shape): not on the layer count, on whether lm_head is
//   tied, or on the order tensors are created in. Uniform u in (0, 1) from the top 53 bits;
//   standard normals by Box-Muller (both outputs used: z0 then z1).
// Scales (all drawn in double, then rounded to T, so float and double models hold the same
//   values up to one rounding):
//   Linear [out, in]         N(0, 1) / sqrt(in)
//   embed_tokens, lm_head    N(0, 1) / sqrt(C)     (logits of a tied head are then O(1))
//   norm weights             1 + 0.1 N(0, 1)       (not all ones, so tests exercise them)
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tspemu/reference/model.hpp"

namespace tspemu::ref {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  double uniform();  // (0, 1)
  double normal();   // N(0, 1), Box-Muller
 private:
  std::uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

std::uint64_t fnv1a64(std::string_view s);

// n standard-normal draws from the stream of (seed, name), in double.
std::vector<double> normal_stream(std::uint64_t seed, std::string_view name, std::size_t n);

template <class T>
ModelWeights<T> init_weights(const ModelConfig& cfg, std::uint64_t seed);

// Converts between scalar types element-wise (double -> float rounds to nearest).
template <class To, class From>
ModelWeights<To> convert_weights(const ModelWeights<From>& w);

}  // namespace tspemu::ref
