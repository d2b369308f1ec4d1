#include "tspemu/reference/kv_cache.hpp"

#include <stdexcept>
#include <string>

namespace tspemu::ref {

template <class T>
KvCache<T>::KvCache(const ModelConfig& cfg, int B, std::int64_t max_context) {
  cfg.validate();
  if (B <= 0) throw std::invalid_argument("KvCache: batch B=" + std::to_string(B) + " must be > 0");
  if (max_context < 0) {
    throw std::invalid_argument("KvCache: max_context=" + std::to_string(max_context) +
                                " must be >= 0 (0: unbounded)");
  }
  n_layers_ = cfg.n_layers;
  batch_ = B;
  kv_heads_ = cfg.n_kv_heads;
  head_size_ = cfg.head_size();
  max_context_ = max_context;
  entries_.resize(std::size_t(n_layers_) * B);
}

template <class T>
const typename KvCache<T>::Entry& KvCache<T>::entry(int layer, int seq) const {
  if (layer < 0 || layer >= n_layers_) {
    throw std::out_of_range("KvCache: layer " + std::to_string(layer) + " outside [0, " +
                            std::to_string(n_layers_) + ")");
  }
  if (seq < 0 || seq >= batch_) {
    throw std::out_of_range("KvCache: sequence " + std::to_string(seq) + " outside [0, " +
                            std::to_string(batch_) + ")");
  }
  return entries_[std::size_t(layer) * batch_ + seq];
}

template <class T>
std::int64_t KvCache<T>::length(int layer, int seq) const {
  return std::int64_t(entry(layer, seq).k.size() / row());
}

template <class T>
std::span<const T> KvCache<T>::at(const std::vector<T>& rows, int layer, int seq,
                                  std::int64_t pos) const {
  const std::int64_t len = std::int64_t(rows.size() / row());
  if (pos < 0 || pos >= len) {
    throw std::out_of_range("KvCache: position " + std::to_string(pos) + " of layer " +
                            std::to_string(layer) + " sequence " + std::to_string(seq) +
                            " outside [0, " + std::to_string(len) + ")");
  }
  return {rows.data() + std::size_t(pos) * row(), row()};
}

template <class T>
std::span<const T> KvCache<T>::k(int layer, int seq, std::int64_t pos) const {
  return at(entry(layer, seq).k, layer, seq, pos);
}

template <class T>
std::span<const T> KvCache<T>::v(int layer, int seq, std::int64_t pos) const {
  return at(entry(layer, seq).v, layer, seq, pos);
}

template <class T>
const T* KvCache<T>::keys(int layer, int seq) const {
  return entry(layer, seq).k.data();
}

template <class T>
const T* KvCache<T>::values(int layer, int seq) const {
  return entry(layer, seq).v.data();
}

template <class T>
void KvCache<T>::append(int layer, int seq, const T* k, const T* v, int count) {
  Entry& e = entry(layer, seq);
  const std::int64_t len = std::int64_t(e.k.size() / row());
  if (count < 0) throw std::invalid_argument("KvCache::append: count=" + std::to_string(count));
  if (max_context_ > 0 && len + count > max_context_) {
    throw std::length_error("KvCache: layer " + std::to_string(layer) + " sequence " +
                            std::to_string(seq) + " would write position " +
                            std::to_string(len + count - 1) +
                            ", beyond max_context=" + std::to_string(max_context_) +
                            " (positions 0.." + std::to_string(max_context_ - 1) + ")");
  }
  const std::size_t n = std::size_t(count) * row();
  e.k.insert(e.k.end(), k, k + n);
  e.v.insert(e.v.end(), v, v + n);
}

template <class T>
std::size_t KvCache<T>::bytes() const {
  std::size_t n = 0;
  for (const Entry& e : entries_) n += e.k.size() + e.v.size();
  return n * sizeof(T);
}

template class KvCache<float>;
template class KvCache<double>;

}  // namespace tspemu::ref
