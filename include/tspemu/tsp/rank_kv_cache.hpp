// RankKvCache: one rank's share of a sequence-sharded key/value cache, held as rank state in
// arena memory of Category::kv_cache (runtime/arena.hpp) between decode steps.
//
// What (dimension letters of model_config.hpp; r this rank; KvOwnership of kv_ownership.hpp):
//   for each layer l and sequence b, the post-RoPE K and the V of ALL NKV heads of the positions
//   rank r owns, in ascending global position (the order they are written in):
//     keys(l, b), values(l, b)   [held(l, b), NKV, hs]   attention's key block on this rank
//     positions(l, b)            [held(l, b)]            their global positions, ascending
//     k(l, b, pos), v(l, b, pos) [NKV, hs]               one position, for checking against the
//                                                        reference KvCache (reference/kv_cache.hpp)
// Memory: constructed once per batch, it reserves, in ONE arena allocation, room for every
//   position rank r owns below max_context of each sequence (a serving engine's KV pool, sized at
//   admission), so a step never allocates and the arena's kv_cache category equals bytes():
//     bytes() = round_up(2 · L · NKV · hs · sizeof(T) · Σ_b count(r, b, max_context), 64)
//   (count: KvOwnership's closed form; 64: the arena's granularity). used_bytes() is the part
//   that holds positions: 2 · NKV · hs · sizeof(T) · Σ_{l,b} held(l, b).
// Requirements: a validated ModelConfig; max_context >= every prompt length; used by its rank's
//   thread only (like its Arena), and destroyed before the Arena.
// Guarantees:
//   - append(l, b, pos, k, v) accepts only a position rank r owns, above every position already
//     held by (l, b), and within the reservation; layer l > 0 must append the positions layer 0
//     did, in the same order. Otherwise std::logic_error (a schedule bug) or std::length_error
//     (position >= max_context), naming rank, layer, sequence and position; nothing is written.
//   - Accessors throw std::out_of_range naming rank, layer, sequence, position and its owner when
//     asked for a position this rank does not hold.
// Cost: append copies 2·NKV·hs elements; k/v look a position up by binary search.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tspemu/reference/model_config.hpp"
#include "tspemu/runtime/arena.hpp"
#include "tspemu/tsp/kv_ownership.hpp"

namespace tspemu::tsp {

template <class T>
class RankKvCache {
 public:
  RankKvCache() = default;
  RankKvCache(Arena& arena, int rank, const ref::ModelConfig& cfg, KvOwnership ownership,
              std::int64_t max_context);

  int rank() const { return rank_; }
  int n_layers() const { return n_layers_; }
  int batch() const { return ownership_.batch(); }
  int kv_heads() const { return kv_heads_; }
  int head_size() const { return head_size_; }
  std::int64_t max_context() const { return max_context_; }
  std::size_t row() const { return static_cast<std::size_t>(kv_heads_) * head_size_; }
  const KvOwnership& ownership() const { return ownership_; }

  std::int64_t capacity(int seq) const;  // positions reserved for seq: count(r, seq, max_context)
  std::int64_t held(int layer, int seq) const;
  std::span<const std::int64_t> positions(int layer, int seq) const;  // [held], ascending
  bool holds(int layer, int seq, std::int64_t pos) const;

  const T* keys(int layer, int seq) const;                           // [held, NKV, hs]
  const T* values(int layer, int seq) const;                         // [held, NKV, hs]
  std::span<const T> k(int layer, int seq, std::int64_t pos) const;  // [NKV, hs]
  std::span<const T> v(int layer, int seq, std::int64_t pos) const;  // [NKV, hs]

  // Appends position pos of (layer, seq): k, v [NKV, hs], k already rotated at pos.
  void append(int layer, int seq, std::int64_t pos, const T* k, const T* v);

  std::size_t bytes() const;  // the reservation, as the arena charges it
  std::size_t used_bytes() const;

 private:
  std::size_t slot(int layer, int seq, std::int64_t pos) const;  // index among held, or throws
  std::size_t region(int layer, int seq) const;                  // K of (layer, seq); V follows
  void check(int layer, int seq) const;

  int rank_ = 0, n_layers_ = 0, kv_heads_ = 0, head_size_ = 0;
  std::int64_t max_context_ = 0;
  KvOwnership ownership_;
  std::vector<std::size_t> capacity_;                 // [B]
  std::vector<std::size_t> offset_;                   // [L·B] element offset of (l, b)'s K
  std::vector<std::size_t> held_;                     // [L·B]
  std::vector<std::vector<std::int64_t>> positions_;  // [B]: layer 0's held positions
  Buffer<T> storage_;                                 // Category::kv_cache
};

extern template class RankKvCache<float>;
extern template class RankKvCache<double>;

}  // namespace tspemu::tsp
