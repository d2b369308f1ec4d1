// Reference decoding: prefill a batch of prompts into a KvCache, then decode one token per
// sequence per step, and a generate loop with a Sampler.
//
// What (dimension letters of model_config.hpp; B sequences, P_b the prompt length of sequence b,
//   S_b its cached positions):
//   prefill(w, prompts)        runs every prompt through the model at positions 0..P_b-1, leaves
//                              the post-RoPE K and V of every layer and position in the cache, and
//                              returns the logits of each prompt's LAST position [B, V].
//   decode_step(w, cache, t)   feeds token t[b] at position S_b of sequence b (RoPE at that global
//                              position), appends its K/V, attends it to positions 0..S_b, and
//                              returns the logits [B, V]; every S_b grows by one.
//   generate(w, prompts, n, s) prefill, then n-1 decode steps, each fed the token the sampler
//                              picked from the previous logits: n new tokens per sequence.
//   Every pass is the training forward's own blocks (model.hpp): attention_block_forward with an
//   AttentionCore that appends the new keys to the cache and attends the new queries to the
//   sequence's cached keys (causal_attention_forward with explicit positions), mlp_block_forward,
//   then the final norm and LM head on the last token of each sequence.
//   Each sequence runs its own pass (GEMMs of its own rows only): an OpenBLAS product's bits for
//   one row can depend on the other rows of the call (blocking, edge kernels; measured in double),
//   so stacking the B sequences into one GEMM would make a sequence's logits depend on its
//   batch-mates. The price is B reads of the weights per step instead of one.
// What it refuses to do: no padding, no paged blocks, no eviction, no speculative or chunked
//   decode entry point, no threads beyond the kernels'.
// Requirements: weights shaped as ModelWeights::zeros(config).
// Guarantees:
//   - Equal to the cache-free forward: the logits of step s for sequence b are model_forward's
//     logits over that sequence's prompt + fed tokens, at its last position, up to the rounding of
//     differently blocked GEMMs (tests/reference/decode_test.cpp states the bound).
//   - A sequence's logits and greedy tokens do not depend on its batch-mates, bitwise (per-sequence
//     passes, above). Seeded tokens do, by design: one random stream (sampling.hpp).
//   - Deterministic, reentrant (no shared mutable state), as the rest of the reference.
//   - Input errors throw std::invalid_argument naming the value, before anything is computed or
//     written: an empty batch or prompt (naming the sequence), a token outside [0, V) (naming
//     sequence, position and value), a token count that is not B, n_new < 1; a prompt longer than
//     max_context, or a step that would write position max_context, throws std::length_error
//     naming the sequence and the position.
// Cost: prefill ~ model_forward over each prompt (logits of its last row only); a decode step reads
//   every weight once per sequence (GEMMs of one row) and the 2·L·S_b·NKV·hs cached elements of
//   each sequence.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tspemu/reference/kv_cache.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/sampling.hpp"

namespace tspemu::ref {

template <class T>
struct Prefill {
  KvCache<T> cache;
  std::vector<T> logits;  // [B, V] at each prompt's last position
};

// max_context: the largest number of positions a sequence may hold (0: unbounded).
template <class T>
Prefill<T> prefill(const ModelWeights<T>& w, const std::vector<std::vector<std::int32_t>>& prompts,
                   std::int64_t max_context = 0);

// Returns the logits [B, V] of the B new tokens (tokens [B], one per sequence).
template <class T>
std::vector<T> decode_step(const ModelWeights<T>& w, KvCache<T>& cache,
                           std::span<const std::int32_t> tokens);

template <class T>
struct Generation {
  std::vector<std::vector<std::int32_t>> tokens;  // [B][n_new] the generated tokens
  std::vector<std::vector<T>> logits;  // [n_new] of [B, V]: logits[i] chose tokens[.][i]; empty
                                       // unless keep_logits
  KvCache<T> cache;                    // prompts + the first n_new - 1 generated tokens
};

template <class T>
Generation<T> generate(const ModelWeights<T>& w,
                       const std::vector<std::vector<std::int32_t>>& prompts, int n_new,
                       Sampler& sampler, std::int64_t max_context = 0, bool keep_logits = true);

}  // namespace tspemu::ref
