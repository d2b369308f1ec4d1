// Sampler: picks the next token of every sequence of a batch from its logits.
//
// What: two modes.
//   greedy   token = argmax_i logits[b, i]; ties go to the LOWEST index (the first maximum), so
//            tied logits give one answer on every rank and in every run.
//              torch: logits.argmax(-1) (which also returns the first maximal index)
//   seeded   token ~ softmax(logits[b] / temperature) restricted to the top_k largest logits
//            (top_k = 0: all V; top_k > V: all V, as Hugging Face clamps it). The top-k set ranks
//            by (logit descending, index ascending), so ties at the k-th logit keep the lowest
//            indices. ONE random stream (SplitMix64, init.hpp) serves the whole batch: each call
//            draws exactly one uniform u in (0, 1) per sequence, sequences in batch order, and
//            returns the first candidate index i (ascending) whose cumulative weight
//            Σ_{j <= i} w_j exceeds u · Σ_j w_j, with w_j = exp((l_j - max l) / temperature)
//            computed in double for either scalar type (the last candidate if rounding leaves
//            none). A schedule that samples once and broadcasts, or samples on every rank from
//            the same seed, therefore gets the same tokens; a rank sampling from its own stream
//            does not.
// Requirements: logits [B, V] with B, V > 0; seeded: temperature finite and > 0, top_k >= 0.
// Guarantees:
//   - Deterministic: same seed, same calls, same tokens (bitwise; no global state).
//   - Greedy is a pure function of each row, so a sequence's greedy tokens do not depend on its
//     batch-mates. Seeded tokens do (one stream): sequence b's draw is the (B·step + b)-th.
//   - A NaN logit is an error (std::domain_error naming sequence and index), never a token.
//   - Bad parameters throw std::invalid_argument naming the value.
// Cost: greedy O(B·V); seeded O(B·V log k) for the top-k selection, O(B·V) without it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tspemu/reference/init.hpp"

namespace tspemu::ref {

class Sampler {
 public:
  static Sampler greedy();
  static Sampler seeded(std::uint64_t seed, double temperature, int top_k = 0);

  // One token per row of logits [B, V].
  template <class T>
  std::vector<std::int32_t> sample(std::span<const T> logits, int B, int V);

  bool is_greedy() const { return greedy_; }
  std::uint64_t draws() const { return draws_; }  // uniforms drawn so far (B per seeded call)

 private:
  Sampler(bool greedy, std::uint64_t seed, double temperature, int top_k)
      : greedy_(greedy), temperature_(temperature), top_k_(top_k), rng_(seed) {}
  bool greedy_;
  double temperature_;
  int top_k_;
  SplitMix64 rng_;
  std::uint64_t draws_ = 0;
};

// The greedy choice for one row of n logits: the first maximum (lowest index among ties).
template <class T>
std::int32_t argmax_first(const T* row, int n);

}  // namespace tspemu::ref
