// DecoderBase: what every parallel decoder (tspw_decoder.hpp, tspm_decoder.hpp, tp_decoder.hpp,
// helix_decoder.hpp, mesh_decoder.hpp and sp_decoder.hpp through it) holds and does the same way —
// the public prefill / decode_step pair with its input checks, this rank's KV cache and the
// sequences' lengths, and what the last step's collectives moved. A decoder says only where its
// cache lives (cache_layout) and how one step runs (forward).
//
// Requirements: as the decoders' (the same calls with the same arguments on every rank; a decoder
//   lives inside one World::run). Shape has `model`, `batch`, `max_context` (DecodeShape,
//   MeshDecodeShape); Traffic is value-initializable.
// Guarantees:
//   - prefill checks the prompts (B of them, none empty, every token in [0, V), within
//     max_context: std::invalid_argument / std::length_error prefixed by the decoder's name, e.g.
//     "TSP-W decode: ..."), frees the old cache, reserves the new one for max_context positions
//     of every sequence (RankKvCache, Category::kv_cache), and runs the step inside the memory
//     phase "<phase>.prefill"; decode_step checks the tokens (and that prefill came first) the
//     same way and runs inside "<phase>.decode", then advances every sequence by one position.
//   - last_traffic() is reset before each step, so it holds that step's collectives alone.
//   - cache() throws std::logic_error before prefill; length(seq) std::out_of_range outside
//     [0, B); kv_cache_bytes() is 0 before prefill, else the cache's arena charge.
// Cost: the decoder's forward; the base adds O(B) checks per step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"

namespace tspemu::tsp {

namespace detail {
struct DecodeStep;  // decode_parts.hpp
}  // namespace detail

// Where a rank's cache lives: this rank is token shard `shard` of `shards` (KvOwnership over
// them, generated tokens round-robin in blocks of `interleave`), and holds `kv_heads` KV heads of
// each of its positions.
struct CacheLayout {
  int shard = 0;
  int shards = 1;
  int interleave = 1;
  int kv_heads = 1;
};

template <class T, class Shape, class Traffic>
class DecoderBase {
 public:
  DecoderBase(const DecoderBase&) = delete;
  DecoderBase& operator=(const DecoderBase&) = delete;

  // Same prompts on every rank (B of them, lengths may differ). Returns logits [B, V] at each
  // prompt's last position, bitwise identical on every rank.
  std::vector<T> prefill(const std::vector<std::vector<std::int32_t>>& prompts);
  // tokens [B], the same on every rank. Returns logits [B, V], bitwise identical on every rank.
  std::vector<T> decode_step(std::span<const std::int32_t> tokens);

  const RankKvCache<T>& cache() const;  // throws std::logic_error before prefill
  std::size_t kv_cache_bytes() const;   // 0 before prefill
  std::int64_t length(int seq) const;   // positions of sequence seq so far
  const Traffic& last_traffic() const { return traffic_; }
  const Shape& shape() const { return s_; }

 protected:
  // who: the error messages' prefix ("TSP-W decode"); phase: the memory phases' ("tspw").
  DecoderBase(Rank& rank, const Shape& shape, std::string who, std::string phase);
  virtual ~DecoderBase() = default;

  // This rank's place in the cache's token sharding (called at prefill, after construction).
  virtual CacheLayout cache_layout() const = 0;
  // One step over the new tokens (the cache already holds every earlier position): appends their
  // K/V, fills traffic_, returns logits [B, V].
  virtual std::vector<T> forward(detail::DecodeStep&& step) = 0;

  Rank& rank_;
  Shape s_;
  std::string who_;
  std::unique_ptr<RankKvCache<T>> cache_;
  std::vector<std::int64_t> lengths_;  // [B]
  Traffic traffic_;

 private:
  std::string phase_;
};

}  // namespace tspemu::tsp
