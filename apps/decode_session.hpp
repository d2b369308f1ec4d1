// The seam between `tspemu generate` and a decode schedule: one rank's decode session, and the
// table of the strategies that make one.
//
// What: a DecodeSession is one rank's part of a schedule that prefills a batch of B prompts and
//   then decodes one token per sequence per step. Both calls return the logits [B, V] of each
//   sequence's newest position, which every rank must return (the command samples each rank's
//   logits with that rank's own copy of the sampler and fails, naming the rank and the step, when
//   the ranks would pick different tokens). kv_cache_bytes() is what this rank holds in its KV
//   cache now. A DecodeStrategy names a schedule, says which shapes it can run (the reason it
//   cannot, in its own words; the command prefixes the flag), makes a rank's session, and gives
//   the closed form of a rank's KV cache bytes, which the command compares with the measured
//   bytes to the byte, and optionally of a rank's decode-step traffic per collective kind.
// Requirements: make() is called on every rank of a World of shape.ranks ranks, on the rank's
//   thread, only for a shape why_invalid() accepts; each rank calls prefill once, then
//   decode_step any number of times, the ranks in the same order (a session may run collectives).
//   The master weights outlive the sessions.
// Guarantees: decode_strategies() is built once; its names are unique; the first entry is the
//   single-rank reference decoder (reference/decode.hpp), which every other entry is checked
//   against.
// Cost: what the schedule costs; the table itself nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/counters.hpp"

namespace tspemu {
class Rank;
}

namespace tspemu::app {

// What a decode strategy runs on: the model, the ranks, the batch and the context bound.
struct GenerateShape {
  ref::ModelConfig model;
  int ranks = 1;                 // D
  int batch = 1;                 // B
  std::int64_t max_context = 0;  // positions a sequence may hold (0: unbounded)
  int interleave = 1;            // I: generated tokens' K/V go to ranks in blocks of I
};

class DecodeSession {
 public:
  virtual ~DecodeSession() = default;
  // prompts [B][P_b]; returns logits [B, V] at each prompt's last position.
  virtual std::vector<float> prefill(const std::vector<std::vector<std::int32_t>>& prompts) = 0;
  // tokens [B], one per sequence at its next position; returns logits [B, V].
  virtual std::vector<float> decode_step(std::span<const std::int32_t> tokens) = 0;
  virtual std::uint64_t kv_cache_bytes() const = 0;  // this rank's, now
};

struct DecodeStrategy {
  std::string name;         // the --strategy value
  std::string description;  // one line for --help
  // "" when the strategy can run the shape, else why not (no flag named: the caller adds it).
  std::function<std::string(const GenerateShape&)> why_invalid;
  std::function<std::unique_ptr<DecodeSession>(Rank&, const GenerateShape&,
                                               const ref::ModelWeights<float>&)>
      make;
  // A rank's KV cache bytes after prompts of prompt_lengths and new_tokens tokens each (the
  // closed form), and that form in words for the report.
  std::function<std::uint64_t(const GenerateShape&, std::span<const std::int64_t> prompt_lengths,
                              int new_tokens, int rank)>
      kv_cache_bytes;
  std::string kv_formula;
  // Optional (empty: the strategy states none; its initializer lets an entry omit it): a rank's
  // traffic over the N - 1 decode steps after prompts of prompt_lengths, per collective kind as
  // the runtime counts it (counters.hpp), the closed form the commands compare with the measured
  // counts with ==.
  std::function<TrafficCounters(const GenerateShape&, std::span<const std::int64_t> prompt_lengths,
                                int new_tokens, int rank)>
      decode_traffic = {};
};

// The table, reference first.
const std::vector<DecodeStrategy>& decode_strategies();
// nullptr for an unknown name.
const DecodeStrategy* decode_strategy_named(const std::string& name);
// The names, comma-separated, for messages.
std::string decode_strategy_names();

// The strategy and degree `tspemu generate` runs with no --strategy / --ranks: the reference on
// 1 rank until a parallel decode strategy is registered (decode_strategies.cpp says where).
struct GenerateDefault {
  const char* strategy;
  int ranks;
};
GenerateDefault generate_default();

}  // namespace tspemu::app
