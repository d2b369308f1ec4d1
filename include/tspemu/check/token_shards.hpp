// TokenShards: which tokens of a [B, S, C] activation each rank holds, for scattering a check's
// inputs and gathering its outputs.
//
// What: rank r holds batches [batch_begin, batch_begin + batches) and, of each, the tokens at the
// global positions `positions` in that local order; its activations are [batches, tokens, C].
//   sequence_sharded(layout, B)   the layout's shard on every batch (zigzag, contiguous, striped)
//   replicated_tokens(B, S)       every token on every rank (TP)
//   data_parallel(replicas, n, B, inner)   rank = replica·n + i holds batches
//                                 [replica·B/replicas, ...) and inner(i)'s positions
// Requirements: positions in [0, S); every (batch, position) held by at least one rank; ranks
// holding the same token must produce bitwise equal outputs (replicas), which the check verifies.
// Guarantees: the functions are pure and cheap; validate() throws std::invalid_argument naming
// the rank and the value at fault.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tspemu/tsp/sequence_layout.hpp"

namespace tspemu::check {

struct TokenShard {
  int batch_begin = 0;
  int batches = 0;
  std::vector<std::int64_t> positions;  // global, in local order
};

using TokenShards = std::function<TokenShard(int rank)>;

TokenShards sequence_sharded(const tsp::SequenceLayout& layout, int B);
TokenShards replicated_tokens(int B, int S);
TokenShards data_parallel(int replicas, int ranks_per_replica, int B, const TokenShards& inner);

// Every rank's shard, checked against [B, S] over `ranks` ranks.
std::vector<TokenShard> resolve_tokens(const TokenShards& shards, int ranks, int B, int S);

}  // namespace tspemu::check
