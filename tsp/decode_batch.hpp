// DecodeBatch: the new tokens of one prefill or decode step of a sequence-sharded decoder, checked
// and laid out sequence-major (private to tsp/; tspm_decoder.cpp uses it, and any decoder with the
// DecodeShape call shape can).
//
// What: sequence b's count[b] new tokens at global positions start_b.. are rows offset[b].. of the
//   step's N rows (prefill: the whole prompt from position 0; decode: one token at the sequence's
//   current length).
// Requirements: B >= 1, V >= 1, max_context >= 1; lengths [B] the positions each sequence holds.
// Guarantees: bad input throws before anything is laid out, the message prefixed by `who` (e.g.
//   "TSP-M decode") and naming the sequence, position and value: std::invalid_argument for a count
//   other than B, an empty prompt, a token outside [0, V); std::length_error for a prompt longer
//   than max_context or a decode step past it.
// Cost: O(N).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tspemu::tsp {

struct DecodeBatch {
  std::vector<std::int32_t> tokens;     // [N]
  std::vector<int> count;               // [B]
  std::vector<std::size_t> offset;      // [B]
  std::vector<std::int64_t> positions;  // [N] global
  bool prefill = false;
  int rows() const { return static_cast<int>(tokens.size()); }
  int batch() const { return static_cast<int>(count.size()); }
  // The prompt lengths of a prefill batch (count as positions).
  std::vector<std::int64_t> lengths() const { return {count.begin(), count.end()}; }
};

DecodeBatch prefill_batch(const std::string& who,
                          const std::vector<std::vector<std::int32_t>>& prompts, int B, int V,
                          std::int64_t max_context);
DecodeBatch decode_batch(const std::string& who, std::span<const std::int32_t> tokens,
                         std::span<const std::int64_t> lengths, int V, std::int64_t max_context);

}  // namespace tspemu::tsp
