#include "tspemu/check/token_shards.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace tspemu::check {

TokenShards sequence_sharded(const tsp::SequenceLayout& layout, int B) {
  return [layout, B](int rank) {
    if (rank >= layout.ranks())
      throw std::invalid_argument("sequence_sharded: rank " + std::to_string(rank) +
                                  " outside the layout's " + std::to_string(layout.ranks()) +
                                  " ranks");
    return TokenShard{0, B, layout.positions(rank)};
  };
}

TokenShards replicated_tokens(int B, int S) {
  return [B, S](int) {
    TokenShard t{0, B, std::vector<std::int64_t>(static_cast<std::size_t>(S))};
    for (int i = 0; i < S; ++i) t.positions[static_cast<std::size_t>(i)] = i;
    return t;
  };
}

TokenShards two_level_sharded(const tsp::TwoLevelLayout& layout, int B) {
  return [layout, B](int rank) {
    const int U = layout.inner().ranks(), ranks = U * layout.outer().ranks();
    if (rank >= ranks)
      throw std::invalid_argument("two_level_sharded: rank " + std::to_string(rank) +
                                  " outside the layout's " + std::to_string(ranks) + " ranks");
    return TokenShard{0, B, layout.positions(rank / U, rank % U)};
  };
}

TokenShards data_parallel(int replicas, int ranks_per_replica, int B, const TokenShards& inner) {
  if (replicas <= 0 || ranks_per_replica <= 0 || B % replicas != 0)
    throw std::invalid_argument("data_parallel: B=" + std::to_string(B) +
                                " must be divisible by replicas=" + std::to_string(replicas) +
                                " (ranks per replica " + std::to_string(ranks_per_replica) + ")");
  return [=](int rank) {
    const int replica = rank / ranks_per_replica, i = rank % ranks_per_replica;
    TokenShard t = inner(i);
    t.batches = B / replicas;
    t.batch_begin = replica * t.batches;
    return t;
  };
}

void scatter_rows(const TokenShard& t, int S, int C, const float* full, float* local) {
  for_each_row(t, S, C, [&](std::size_t l, std::size_t g) {
    std::memcpy(local + l, full + g, static_cast<std::size_t>(C) * sizeof(float));
  });
}

void gather_rows(const TokenShard& t, int S, int C, const float* local, float* full) {
  for_each_row(t, S, C, [&](std::size_t l, std::size_t g) {
    std::memcpy(full + g, local + l, static_cast<std::size_t>(C) * sizeof(float));
  });
}

std::vector<TokenShard> resolve_tokens(const TokenShards& shards, int ranks, int B, int S) {
  if (!shards) throw std::invalid_argument("check: no token shards given (BlockCheck::tokens)");
  std::vector<TokenShard> out;
  std::vector<char> held(static_cast<std::size_t>(B) * S, 0);
  for (int r = 0; r < ranks; ++r) {
    TokenShard t = shards(r);
    const std::string who = "token shards: rank " + std::to_string(r);
    if (t.batch_begin < 0 || t.batches <= 0 || t.batch_begin + t.batches > B)
      throw std::invalid_argument(who + " holds batches [" + std::to_string(t.batch_begin) + ", " +
                                  std::to_string(t.batch_begin + t.batches) +
                                  "), outside [0, B=" + std::to_string(B) + ")");
    if (t.positions.empty()) throw std::invalid_argument(who + " holds no token");
    for (const std::int64_t p : t.positions) {
      if (p < 0 || p >= S)
        throw std::invalid_argument(who + " holds position " + std::to_string(p) +
                                    ", outside [0, S=" + std::to_string(S) + ")");
      for (int b = t.batch_begin; b < t.batch_begin + t.batches; ++b)
        held[static_cast<std::size_t>(b) * S + static_cast<std::size_t>(p)] = 1;
    }
    out.push_back(std::move(t));
  }
  for (std::size_t i = 0; i < held.size(); ++i)
    if (!held[i])
      throw std::invalid_argument("token shards: token (batch " + std::to_string(i / S) +
                                  ", position " + std::to_string(i % S) +
                                  ") is held by no rank of " + std::to_string(ranks) +
                                  " (does the layout divide S=" + std::to_string(S) + "?)");
  return out;
}

}  // namespace tspemu::check
