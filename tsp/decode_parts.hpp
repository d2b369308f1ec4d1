// What the tensor-parallel decoders share (private to tspemu::tsp; tp_decoder.hpp,
// helix_decoder.hpp): the step of new tokens with the input checks and their messages, the
// measurement of what a collective moved on this rank, weight slices cut from the master, and the
// blocks that are plain Megatron TP over a group of n ranks — the vocabulary-parallel embedding
// (all-reduce) and LM head (all-gather of [B, V/n]) and the MLP (column gate/up, row down +
// all-reduce).
//
// Every GEMM, norm and attention call is per sequence (one GEMM row's bits can depend on the other
// rows of its call, reference/decode.hpp) and the collectives are element-wise, so a sequence's
// logits do not depend on its batch-mates, bitwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::tsp::detail {

using Prompts = std::vector<std::vector<std::int32_t>>;

// The new tokens of one step, sequence-major: sequence b's count[b] tokens at global positions
// start[b].. are rows offset[b].. of the step's N rows.
struct DecodeStep {
  std::vector<std::int32_t> tokens;     // [N]
  std::vector<int> count;               // [B]
  std::vector<std::size_t> offset;      // [B]
  std::vector<std::int64_t> positions;  // [N] global
  bool prefill = false;
  int rows() const { return static_cast<int>(tokens.size()); }
};

// Every prompt at positions 0..P_b-1. std::invalid_argument (or std::length_error past
// max_context) prefixed by `who`, naming the sequence, position and value: B prompts expected, an
// empty prompt, a token outside [0, V).
DecodeStep prefill_step(const std::string& who, const Prompts& prompts, int B, int V,
                        std::int64_t max_context);
// One token per sequence at position lengths[b]. Throws as prefill_step, and when `prefilled` is
// false ("decode_step before prefill").
DecodeStep next_step(const std::string& who, std::span<const std::int32_t> tokens,
                     const std::vector<std::int64_t>& lengths, int V, std::int64_t max_context,
                     bool prefilled);
// The prompts' lengths of a prefill step.
std::vector<std::int64_t> step_lengths(const DecodeStep& step);

// Runs one collective, adding what it moved on this rank (every Comm of the rank counts into the
// rank's counters) to `into`.
void measured(Rank& rank, TrafficCounters& into, const std::function<void()>& collective);

// Rows [first, first + n) of the row-major master [*, cols].
template <class T>
Buffer<T> rows_of(Arena& a, const std::vector<T>& master, std::size_t cols, std::size_t first,
                  std::size_t n);
// Columns [first, first + n) of the row-major master [rows, ld], as [rows, n].
template <class T>
Buffer<T> cols_of(Arena& a, const std::vector<T>& master, std::size_t rows, std::size_t ld,
                  std::size_t first, std::size_t n);

// Shard r of n of the vocabulary: rows [r·V/n, (r+1)·V/n) of the embedding and of the LM head
// (the embedding's when tied), and the final norm whole. Requires n | V.
template <class T>
struct VocabShard {
  int n = 1, r = 0, Vl = 0;
  Buffer<T> embed, head, final_norm;  // [Vl, C], [Vl, C] (empty when tied), [C]
  VocabShard(Arena& a, const ref::ModelWeights<T>& master, int n, int r);
  const T* head_rows() const { return head.empty() ? embed.data() : head.data(); }
};

// A group of one rank (the row of an SP mesh, T = 1) makes no call: embed, lm_head and mlp_block
// skip their collective there (a call over one rank would move nothing but count a call the
// planner's closed forms do not have).

// x [N, C] = embed_tokens(step.tokens): the owner of each id's row writes it, the others zeros,
// and the all-reduce over `comm` (the vocabulary's n ranks, this rank's index r) adds exact
// zeros, so x is the embedding row bit for bit. `x` must be zeroed.
template <class T>
void embed(Rank& rank, Comm& comm, const VocabShard<T>& v, const DecodeStep& st, int C,
           Buffer<T>& x, TrafficCounters& traffic);

// LM head: final norm of each sequence's last row of x [N, C], this rank's Vl logits,
// all-gathered over `comm` -> [B, V].
template <class T>
std::vector<T> lm_head(Rank& rank, Comm& comm, const VocabShard<T>& v, const DecodeStep& st,
                       const ref::ModelConfig& m, const Buffer<T>& x, TrafficCounters& traffic);

// Shard r of n of one layer's MLP: rows r·F/n.. of gate and up, those columns of down; and the
// post-attention norm weight whole. Requires n | F.
template <class T>
struct MlpShard {
  int Fl = 0;
  Buffer<T> gate, up, down, post_norm;  // [Fl, C], [Fl, C], [C, Fl], [C]
  MlpShard(Arena& a, const ref::LayerWeights<T>& master, const ref::ModelConfig& m, int n, int r);
};

// x [N, C] = mid + all_reduce over `comm` of down^(r)(silu(n·gate^(r)ᵀ) ⊙ n·up^(r)ᵀ), n =
// rmsnorm(mid).
template <class T>
void mlp_block(Rank& rank, Comm& comm, const MlpShard<T>& w, const DecodeStep& st,
               const ref::ModelConfig& m, const Buffer<T>& mid, Buffer<T>& x,
               TrafficCounters& traffic);

}  // namespace tspemu::tsp::detail
