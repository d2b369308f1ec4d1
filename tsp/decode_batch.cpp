#include "decode_batch.hpp"

#include <stdexcept>

namespace tspemu::tsp {

namespace {

std::string str(std::int64_t v) {
  return std::to_string(v);
}

void check_token(const std::string& who, const char* call, int b, std::int64_t pos, std::int32_t t,
                 int V) {
  if (t < 0 || t >= V)
    throw std::invalid_argument(who + ": " + call + ": sequence " + str(b) + " position " +
                                str(pos) + " has token " + str(t) + " outside [0, " + str(V) + ")");
}

}  // namespace

DecodeBatch prefill_batch(const std::string& who,
                          const std::vector<std::vector<std::int32_t>>& prompts, int B, int V,
                          std::int64_t max_context) {
  if (prompts.size() != static_cast<std::size_t>(B))
    throw std::invalid_argument(who +
                                ": prefill: " + str(static_cast<std::int64_t>(prompts.size())) +
                                " prompts for batch B=" + str(B));
  DecodeBatch batch;
  batch.prefill = true;
  for (int b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<std::size_t>(b)];
    const auto n = static_cast<std::int64_t>(p.size());
    if (p.empty())
      throw std::invalid_argument(who + ": prefill: prompt of sequence " + str(b) + " is empty");
    if (n > max_context)
      throw std::length_error(who + ": prefill: sequence " + str(b) + "'s prompt of " + str(n) +
                              " positions exceeds max_context=" + str(max_context));
    for (std::int64_t i = 0; i < n; ++i)
      check_token(who, "prefill", b, i, p[static_cast<std::size_t>(i)], V);
    batch.offset.push_back(batch.tokens.size());
    batch.count.push_back(static_cast<int>(n));
    batch.tokens.insert(batch.tokens.end(), p.begin(), p.end());
    for (std::int64_t i = 0; i < n; ++i) batch.positions.push_back(i);
  }
  return batch;
}

DecodeBatch decode_batch(const std::string& who, std::span<const std::int32_t> tokens,
                         std::span<const std::int64_t> lengths, int V, std::int64_t max_context) {
  const auto B = static_cast<std::int64_t>(lengths.size());
  if (static_cast<std::int64_t>(tokens.size()) != B)
    throw std::invalid_argument(who +
                                ": decode_step: " + str(static_cast<std::int64_t>(tokens.size())) +
                                " tokens for batch B=" + str(B) + " (one per sequence)");
  DecodeBatch batch;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const std::int64_t pos = lengths[b];
    check_token(who, "decode_step", static_cast<int>(b), pos, tokens[b], V);
    if (pos >= max_context)
      throw std::length_error(who + ": decode_step: sequence " + str(static_cast<std::int64_t>(b)) +
                              " would hold position " + str(pos) +
                              ", beyond max_context=" + str(max_context));
    batch.offset.push_back(b);
    batch.count.push_back(1);
    batch.tokens.push_back(tokens[b]);
    batch.positions.push_back(pos);
  }
  return batch;
}

}  // namespace tspemu::tsp
