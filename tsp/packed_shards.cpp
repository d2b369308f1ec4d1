#include "tspemu/tsp/packed_shards.hpp"

#include <algorithm>
#include <cstring>

#include "tspemu/core/dry_run.hpp"

namespace tspemu::tsp {

namespace {

// Copies `rows` rows of `cols` elements between strided matrices.
template <class T>
void copy_block(T* dst, std::size_t dst_ld, const T* src, std::size_t src_ld, std::size_t rows,
                std::size_t cols) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (std::size_t i = 0; i < rows; ++i)
    std::memcpy(dst + i * dst_ld, src + i * src_ld, cols * sizeof(T));
}

struct AttnDims {
  std::size_t C, q_rows, kv_rows;  // q_rows = NHl·hs, kv_rows = NKVl·hs
  std::size_t q_full, kv_full;     // NH·hs, NKV·hs
};
AttnDims attn_dims(const TspShape& s) {
  const std::size_t hs = static_cast<std::size_t>(s.hs());
  return {static_cast<std::size_t>(s.model.hidden), static_cast<std::size_t>(s.NHl()) * hs,
          static_cast<std::size_t>(s.NKVl()) * hs, static_cast<std::size_t>(s.model.n_heads) * hs,
          static_cast<std::size_t>(s.model.n_kv_heads) * hs};
}

template <class P>
AttentionShardView<P> attn_view(P base, const TspShape& s) {
  const AttnDims d = attn_dims(s);
  AttentionShardView<P> v;
  v.wq = base;
  v.wk = v.wq + d.q_rows * d.C;
  v.wv = v.wk + d.kv_rows * d.C;
  v.wo = v.wv + d.kv_rows * d.C;
  return v;
}

template <class P>
MlpShardView<P> mlp_view_of(P base, const TspShape& s) {
  const std::size_t fc =
      static_cast<std::size_t>(s.Fl()) * static_cast<std::size_t>(s.model.hidden);
  return {base, base + fc, base + 2 * fc};
}

}  // namespace

std::size_t attention_shard_size(const TspShape& s) {
  const AttnDims d = attn_dims(s);
  return d.C * (2 * d.q_rows + 2 * d.kv_rows);
}
std::size_t mlp_shard_size(const TspShape& s) {
  return 3 * static_cast<std::size_t>(s.Fl()) * static_cast<std::size_t>(s.model.hidden);
}
template <class T>
AttentionShardView<T*> attention_view(T* p, const TspShape& s) {
  return attn_view(p, s);
}
template <class T>
AttentionShardView<const T*> attention_view(const T* p, const TspShape& s) {
  return attn_view(p, s);
}
template <class T>
MlpShardView<T*> mlp_view(T* p, const TspShape& s) {
  return mlp_view_of(p, s);
}
template <class T>
MlpShardView<const T*> mlp_view(const T* p, const TspShape& s) {
  return mlp_view_of(p, s);
}

template <class T>
void pack_attention_shard(const ref::LayerWeights<T>& m, const TspShape& s, int r, T* packed) {
  const AttnDims d = attn_dims(s);
  const std::size_t ru = static_cast<std::size_t>(r);
  auto v = attention_view(packed, s);
  copy_block(v.wq, d.C, m.wq.data() + ru * d.q_rows * d.C, d.C, d.q_rows, d.C);
  copy_block(v.wk, d.C, m.wk.data() + ru * d.kv_rows * d.C, d.C, d.kv_rows, d.C);
  copy_block(v.wv, d.C, m.wv.data() + ru * d.kv_rows * d.C, d.C, d.kv_rows, d.C);
  copy_block(v.wo, d.q_rows, m.wo.data() + ru * d.q_rows, d.q_full, d.C, d.q_rows);
}

template <class T>
void unpack_attention_shard(const T* packed, const TspShape& s, int r, ref::LayerWeights<T>& m) {
  const AttnDims d = attn_dims(s);
  const std::size_t ru = static_cast<std::size_t>(r);
  auto v = attention_view(packed, s);
  copy_block(m.wq.data() + ru * d.q_rows * d.C, d.C, v.wq, d.C, d.q_rows, d.C);
  copy_block(m.wk.data() + ru * d.kv_rows * d.C, d.C, v.wk, d.C, d.kv_rows, d.C);
  copy_block(m.wv.data() + ru * d.kv_rows * d.C, d.C, v.wv, d.C, d.kv_rows, d.C);
  copy_block(m.wo.data() + ru * d.q_rows, d.q_full, v.wo, d.q_rows, d.C, d.q_rows);
}

template <class T>
void pack_mlp_shard(const ref::LayerWeights<T>& m, const TspShape& s, int r, T* packed) {
  const std::size_t C = static_cast<std::size_t>(s.model.hidden),
                    Fl = static_cast<std::size_t>(s.Fl()),
                    F = static_cast<std::size_t>(s.model.ffn), ru = static_cast<std::size_t>(r);
  auto v = mlp_view(packed, s);
  copy_block(v.gate, C, m.w_gate.data() + ru * Fl * C, C, Fl, C);
  copy_block(v.up, C, m.w_up.data() + ru * Fl * C, C, Fl, C);
  copy_block(v.down, Fl, m.w_down.data() + ru * Fl, F, C, Fl);
}

template <class T>
void unpack_mlp_shard(const T* packed, const TspShape& s, int r, ref::LayerWeights<T>& m) {
  const std::size_t C = static_cast<std::size_t>(s.model.hidden),
                    Fl = static_cast<std::size_t>(s.Fl()),
                    F = static_cast<std::size_t>(s.model.ffn), ru = static_cast<std::size_t>(r);
  auto v = mlp_view(packed, s);
  copy_block(m.w_gate.data() + ru * Fl * C, C, v.gate, C, Fl, C);
  copy_block(m.w_up.data() + ru * Fl * C, C, v.up, C, Fl, C);
  copy_block(m.w_down.data() + ru * Fl, F, v.down, Fl, C, Fl);
}

template <class T>
void unpack_layer(const PackedLayer<T>& layer, const TspShape& s, int r, bool shards, bool norms,
                  ref::LayerWeights<T>& full) {
  if (shards) {
    unpack_attention_shard(layer.attention.data(), s, r, full);
    unpack_mlp_shard(layer.mlp.data(), s, r, full);
  }
  if (norms) {
    std::copy(layer.input_norm.begin(), layer.input_norm.end(), full.input_norm.begin());
    std::copy(layer.post_norm.begin(), layer.post_norm.end(), full.post_norm.begin());
  }
}

#define TSPEMU_PACKED_SHARDS(T)                                                                   \
  template AttentionShardView<T*> attention_view<T>(T*, const TspShape&);                         \
  template AttentionShardView<const T*> attention_view<T>(const T*, const TspShape&);             \
  template MlpShardView<T*> mlp_view<T>(T*, const TspShape&);                                     \
  template MlpShardView<const T*> mlp_view<T>(const T*, const TspShape&);                         \
  template void pack_attention_shard<T>(const ref::LayerWeights<T>&, const TspShape&, int, T*);   \
  template void pack_mlp_shard<T>(const ref::LayerWeights<T>&, const TspShape&, int, T*);         \
  template void unpack_attention_shard<T>(const T*, const TspShape&, int, ref::LayerWeights<T>&); \
  template void unpack_mlp_shard<T>(const T*, const TspShape&, int, ref::LayerWeights<T>&);       \
  template void unpack_layer<T>(const PackedLayer<T>&, const TspShape&, int, bool, bool,          \
                                ref::LayerWeights<T>&);
TSPEMU_PACKED_SHARDS(float)
TSPEMU_PACKED_SHARDS(double)
#undef TSPEMU_PACKED_SHARDS

}  // namespace tspemu::tsp
