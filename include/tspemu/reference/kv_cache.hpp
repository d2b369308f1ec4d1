// KvCache: the reference's key/value cache for decoding, per (layer, sequence, position).
//
// What: for each of L layers and each of B sequences, the keys and values of every cached
//   position, AFTER RoPE for the keys (the rotation at the position's global index, applied once
//   when the key is written, as Hugging Face's `past_key_values` holds them):
//     k(l, b, p), v(l, b, p)      [NKV, hs]   the position p of sequence b in layer l
//     keys(l, b), values(l, b)    [S_b, NKV, hs] all cached positions of (l, b), S_b = length(b)
//   Positions are global and start at 0 for every sequence (a prompt is position 0..P-1, the
//   i-th generated token P+i), so row p of keys(l, b) is position p. A parallel schedule's cache
//   (sharded over ranks by any ownership map) is checked against this one entry by entry.
// Requirements: a validated ModelConfig; B > 0; max_context >= 0 (0: unbounded).
// Guarantees:
//   - Sequences have independent lengths; append() adds rows at the end of one (layer, sequence)
//     and refuses, with std::length_error naming layer, sequence, position and max_context, to
//     write a position >= max_context (when bounded). Nothing is written by a refused append.
//   - Accessors check their indices and throw std::out_of_range naming the index and its bound.
//   - Between the reference's calls (decode.hpp) every layer of a sequence holds the same
//     positions; length(b) is then that count.
// Cost: bytes() = 2 · L · Σ_b S_b · NKV · hs · sizeof(T); append copies its rows (amortized O(1)
//   growth per row, as std::vector).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tspemu/reference/model_config.hpp"

namespace tspemu::ref {

template <class T>
class KvCache {
 public:
  KvCache() = default;
  KvCache(const ModelConfig& cfg, int B, std::int64_t max_context = 0);

  int n_layers() const { return n_layers_; }                               // L
  int batch() const { return batch_; }                                     // B
  int kv_heads() const { return kv_heads_; }                               // NKV
  int head_size() const { return head_size_; }                             // hs
  std::int64_t max_context() const { return max_context_; }                // 0: unbounded
  std::size_t row() const { return std::size_t(kv_heads_) * head_size_; }  // NKV*hs per position

  std::int64_t length(int seq) const { return length(0, seq); }  // S_b (layer 0's count)
  std::int64_t length(int layer, int seq) const;

  std::span<const T> k(int layer, int seq, std::int64_t pos) const;  // [NKV, hs]
  std::span<const T> v(int layer, int seq, std::int64_t pos) const;  // [NKV, hs]
  const T* keys(int layer, int seq) const;                           // [S_b, NKV, hs]
  const T* values(int layer, int seq) const;                         // [S_b, NKV, hs]

  // Appends `count` positions: k and v are [count, NKV, hs], the keys already rotated.
  void append(int layer, int seq, const T* k, const T* v, int count);

  std::size_t bytes() const;

 private:
  struct Entry {
    std::vector<T> k, v;  // [S_b, NKV, hs] each
  };
  const Entry& entry(int layer, int seq) const;
  Entry& entry(int layer, int seq) {
    return const_cast<Entry&>(static_cast<const KvCache&>(*this).entry(layer, seq));
  }
  std::span<const T> at(const std::vector<T>& rows, int layer, int seq, std::int64_t pos) const;

  int n_layers_ = 0, batch_ = 0, kv_heads_ = 0, head_size_ = 0;
  std::int64_t max_context_ = 0;
  std::vector<Entry> entries_;  // [L, B]
};

}  // namespace tspemu::ref
