// TokenShards: which tokens of a [B, S, C] activation each rank holds, for scattering a check's
// inputs and gathering its outputs.
//
// What: rank r holds batches [batch_begin, batch_begin + batches) and, of each, the tokens at the
// global positions `positions` in that local order; its activations are [batches, tokens, C].
//   sequence_sharded(layout, B)   the layout's shard on every batch (zigzag, contiguous, striped)
//   two_level_sharded(layout, B)  rank o·U + i holds the two-level layout's shard (o, i)
//   replicated_tokens(B, S)       every token on every rank (TP)
//   data_parallel(replicas, n, B, inner)   rank = replica·n + i holds batches
//                                 [replica·B/replicas, ...) and inner(i)'s positions
// Requirements: positions in [0, S); every (batch, position) held by at least one rank; ranks
// holding the same token must produce bitwise equal outputs (replicas), which the check verifies.
// Guarantees: the functions are pure and cheap; validate() throws std::invalid_argument naming
// the rank and the value at fault.
#pragma once

#include <cstddef>
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
TokenShards two_level_sharded(const tsp::TwoLevelLayout& layout, int B);
TokenShards replicated_tokens(int B, int S);
TokenShards data_parallel(int replicas, int ranks_per_replica, int B, const TokenShards& inner);

// The token rows of a rank's [batches, tokens, C] activation, in local order: fn(local, global)
// with the row's offsets (in elements) into the local activation and into the full [B, S, C]
// tensor. Scattering inputs and gathering outputs are this loop with a copy of C elements.
template <class Fn>
void for_each_row(const TokenShard& t, int S, int C, Fn fn) {
  const std::size_t T = t.positions.size(), c = static_cast<std::size_t>(C);
  for (int b = 0; b < t.batches; ++b)
    for (std::size_t i = 0; i < T; ++i)
      fn((static_cast<std::size_t>(b) * T + i) * c,
         (static_cast<std::size_t>(t.batch_begin + b) * static_cast<std::size_t>(S) +
          static_cast<std::size_t>(t.positions[i])) *
             c);
}

// Copies the rank's rows of full [B, S, C] into local [batches, tokens, C] (scatter), or back
// (gather; other ranks' rows of full are left alone).
void scatter_rows(const TokenShard& t, int S, int C, const float* full, float* local);
void gather_rows(const TokenShard& t, int S, int C, const float* local, float* full);

// Every rank's shard, checked against [B, S] over `ranks` ranks.
std::vector<TokenShard> resolve_tokens(const TokenShards& shards, int ranks, int B, int S);

}  // namespace tspemu::check
