#include "tspemu/tsp/rank_kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "tspemu/core/dry_run.hpp"

namespace tspemu::tsp {

namespace {

std::string where(int rank, int layer, int seq, std::int64_t pos) {
  return "rank " + std::to_string(rank) + " layer " + std::to_string(layer) + " sequence " +
         std::to_string(seq) + " position " + std::to_string(pos);
}

}  // namespace

template <class T>
RankKvCache<T>::RankKvCache(Arena& arena, int rank, const ref::ModelConfig& cfg,
                            KvOwnership ownership, std::int64_t max_context)
    : rank_(rank),
      n_layers_(cfg.n_layers),
      kv_heads_(cfg.n_kv_heads),
      head_size_(cfg.head_size()),
      max_context_(max_context),
      ownership_(std::move(ownership)) {
  const int B = ownership_.batch();
  if (rank < 0 || rank >= ownership_.ranks()) {
    throw std::invalid_argument("RankKvCache: rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(ownership_.ranks()) + ")");
  }
  for (int b = 0; b < B; ++b) {
    if (ownership_.prompt_length(b) > max_context) {
      throw std::length_error("RankKvCache: sequence " + std::to_string(b) + "'s prompt of " +
                              std::to_string(ownership_.prompt_length(b)) +
                              " positions exceeds max_context=" + std::to_string(max_context));
    }
    capacity_.push_back(static_cast<std::size_t>(ownership_.count(rank, b, max_context)));
  }
  const std::size_t L = static_cast<std::size_t>(n_layers_);
  offset_.resize(L * static_cast<std::size_t>(B));
  held_.assign(offset_.size(), 0);
  positions_.resize(static_cast<std::size_t>(B));
  std::size_t total = 0;
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t b = 0; b < capacity_.size(); ++b) {
      offset_[l * capacity_.size() + b] = total;
      total += 2 * capacity_[b] * row();
    }
  for (std::size_t b = 0; b < capacity_.size(); ++b) positions_[b].reserve(capacity_[b]);
  storage_ = arena.allocate<T>(total, Category::kv_cache);
}

template <class T>
void RankKvCache<T>::check(int layer, int seq) const {
  if (layer < 0 || layer >= n_layers_ || seq < 0 || seq >= batch()) {
    throw std::out_of_range("RankKvCache (rank " + std::to_string(rank_) + "): layer " +
                            std::to_string(layer) + " sequence " + std::to_string(seq) +
                            " outside L=" + std::to_string(n_layers_) +
                            " B=" + std::to_string(batch()));
  }
}

template <class T>
std::size_t RankKvCache<T>::region(int layer, int seq) const {
  check(layer, seq);
  return offset_[static_cast<std::size_t>(layer) * capacity_.size() +
                 static_cast<std::size_t>(seq)];
}

template <class T>
std::int64_t RankKvCache<T>::capacity(int seq) const {
  check(0, seq);
  return static_cast<std::int64_t>(capacity_[static_cast<std::size_t>(seq)]);
}

template <class T>
std::int64_t RankKvCache<T>::held(int layer, int seq) const {
  check(layer, seq);
  return static_cast<std::int64_t>(
      held_[static_cast<std::size_t>(layer) * capacity_.size() + static_cast<std::size_t>(seq)]);
}

template <class T>
std::span<const std::int64_t> RankKvCache<T>::positions(int layer, int seq) const {
  const auto n = static_cast<std::size_t>(held(layer, seq));
  return {positions_[static_cast<std::size_t>(seq)].data(), n};
}

template <class T>
bool RankKvCache<T>::holds(int layer, int seq, std::int64_t pos) const {
  const auto p = positions(layer, seq);
  return std::binary_search(p.begin(), p.end(), pos);
}

template <class T>
std::size_t RankKvCache<T>::slot(int layer, int seq, std::int64_t pos) const {
  const auto p = positions(layer, seq);
  const auto it = std::lower_bound(p.begin(), p.end(), pos);
  if (it == p.end() || *it != pos) {
    std::string owner = "?";
    if (pos >= 0) owner = std::to_string(ownership_.owner(seq, pos));
    throw std::out_of_range("RankKvCache: " + where(rank_, layer, seq, pos) +
                            " is not held here (owner: rank " + owner + ", " +
                            std::to_string(p.size()) + " positions held)");
  }
  return static_cast<std::size_t>(it - p.begin());
}

template <class T>
const T* RankKvCache<T>::keys(int layer, int seq) const {
  return storage_.data() + region(layer, seq);
}

template <class T>
const T* RankKvCache<T>::values(int layer, int seq) const {
  return storage_.data() + region(layer, seq) + capacity_[static_cast<std::size_t>(seq)] * row();
}

template <class T>
std::span<const T> RankKvCache<T>::k(int layer, int seq, std::int64_t pos) const {
  return {keys(layer, seq) + slot(layer, seq, pos) * row(), row()};
}

template <class T>
std::span<const T> RankKvCache<T>::v(int layer, int seq, std::int64_t pos) const {
  return {values(layer, seq) + slot(layer, seq, pos) * row(), row()};
}

template <class T>
void RankKvCache<T>::append(int layer, int seq, std::int64_t pos, const T* k, const T* v) {
  check(layer, seq);
  const std::size_t i =
      static_cast<std::size_t>(layer) * capacity_.size() + static_cast<std::size_t>(seq);
  const std::size_t n = held_[i];
  std::vector<std::int64_t>& held_pos = positions_[static_cast<std::size_t>(seq)];
  if (pos >= max_context_) {
    throw std::length_error("RankKvCache: " + where(rank_, layer, seq, pos) +
                            " is beyond max_context=" + std::to_string(max_context_));
  }
  if (pos < 0 || ownership_.owner(seq, pos) != rank_) {
    throw std::logic_error("RankKvCache: " + where(rank_, layer, seq, pos) +
                           " is not this rank's to hold (" + ownership_.describe(seq) + ")");
  }
  if (n > 0 && held_pos[n - 1] >= pos) {
    throw std::logic_error("RankKvCache: " + where(rank_, layer, seq, pos) +
                           " written after position " + std::to_string(held_pos[n - 1]) +
                           " (positions must be appended in ascending order, once)");
  }
  if (layer == 0) {
    if (n == capacity_[static_cast<std::size_t>(seq)]) {
      throw std::length_error("RankKvCache: " + where(rank_, layer, seq, pos) +
                              " overflows the reservation of " + std::to_string(n) + " positions");
    }
    held_pos.push_back(pos);
  } else if (n >= held_pos.size() || held_pos[n] != pos) {
    throw std::logic_error("RankKvCache: " + where(rank_, layer, seq, pos) +
                           " is not the next position layer 0 holds");
  }
  held_[i] = n + 1;
  if (dry_run()) return;  // unbacked storage (core/dry_run.hpp)
  T* kd = storage_.data() + offset_[i] + n * row();
  T* vd = kd + capacity_[static_cast<std::size_t>(seq)] * row();
  std::memcpy(kd, k, row() * sizeof(T));
  std::memcpy(vd, v, row() * sizeof(T));
}

template <class T>
std::size_t RankKvCache<T>::bytes() const {
  const std::size_t raw = storage_.size() * sizeof(T);
  return (raw + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment;
}

template <class T>
std::size_t RankKvCache<T>::used_bytes() const {
  std::size_t n = 0;
  for (std::size_t h : held_) n += h;
  return 2 * n * row() * sizeof(T);
}

template class RankKvCache<float>;
template class RankKvCache<double>;

}  // namespace tspemu::tsp
