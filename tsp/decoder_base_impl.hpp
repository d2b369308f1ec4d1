// DecoderBase's member definitions (decoder_base.hpp), private to tspemu::tsp: a decoder's .cpp
// includes this and instantiates its own base explicitly, e.g.
//   template class DecoderBase<float, DecodeShape, TspwTraffic>;
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "decode_parts.hpp"
#include "tspemu/tsp/decoder_base.hpp"
#include "tspemu/tsp/kv_ownership.hpp"

namespace tspemu::tsp {

template <class T, class Shape, class Traffic>
DecoderBase<T, Shape, Traffic>::DecoderBase(Rank& rank, const Shape& shape, std::string who,
                                            std::string phase)
    : rank_(rank), s_(shape), who_(std::move(who)), phase_(std::move(phase)) {}

template <class T, class Shape, class Traffic>
const RankKvCache<T>& DecoderBase<T, Shape, Traffic>::cache() const {
  return detail::cache_or_throw(who_, cache_.get());
}

template <class T, class Shape, class Traffic>
std::size_t DecoderBase<T, Shape, Traffic>::kv_cache_bytes() const {
  return cache_ ? cache_->bytes() : 0;
}

template <class T, class Shape, class Traffic>
std::int64_t DecoderBase<T, Shape, Traffic>::length(int seq) const {
  return detail::length_or_throw(who_, lengths_, seq);
}

template <class T, class Shape, class Traffic>
std::vector<T> DecoderBase<T, Shape, Traffic>::prefill(
    const std::vector<std::vector<std::int32_t>>& prompts) {
  detail::DecodeStep step =
      detail::prefill_step(who_, prompts, s_.batch, s_.model.vocab, s_.max_context);
  std::vector<std::int64_t> lengths = detail::step_lengths(step);
  const CacheLayout at = cache_layout();
  ref::ModelConfig held = s_.model;  // the cache's view: this rank's KV heads only
  held.n_kv_heads = at.kv_heads;
  cache_.reset();  // a new batch: the old reservation goes back to the arena first
  cache_ = std::make_unique<RankKvCache<T>>(rank_.arena(), at.shard, held,
                                            KvOwnership(at.shards, at.interleave, lengths),
                                            s_.max_context);
  lengths_ = std::move(lengths);
  auto phase = rank_.arena().phase(phase_ + ".prefill");
  traffic_ = {};
  return forward(std::move(step));
}

template <class T, class Shape, class Traffic>
std::vector<T> DecoderBase<T, Shape, Traffic>::decode_step(std::span<const std::int32_t> tokens) {
  detail::DecodeStep step =
      detail::next_step(who_, tokens, lengths_, s_.model.vocab, s_.max_context, cache_ != nullptr);
  auto phase = rank_.arena().phase(phase_ + ".decode");
  traffic_ = {};
  std::vector<T> logits = forward(std::move(step));
  for (std::int64_t& n : lengths_) ++n;
  return logits;
}

}  // namespace tspemu::tsp
