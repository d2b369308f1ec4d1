// Packed weight shards: what one TSP rank owns of a layer, in the single buffer it broadcasts
// (attention) or circulates (MLP), cut from the full "master" weights of the reference model so
// tests compare directly.
//
// Attention shard r (head shard r: query heads r·NHl.., KV heads r·NKVl..), row-major, in order:
//   wq  [NHl·hs, C]    rows r·NHl·hs.. of q_proj  [NH·hs, C]
//   wk  [NKVl·hs, C]   rows r·NKVl·hs.. of k_proj [NKV·hs, C]
//   wv  [NKVl·hs, C]   rows r·NKVl·hs.. of v_proj
//   wo  [C, NHl·hs]    columns r·NHl·hs.. of o_proj [C, NH·hs]
// Local query head j uses local KV head j / g, as in the full model (NHl / g = NKVl).
// MLP shard r (intermediate columns r·Fl..):
//   gate [Fl, C]  rows of gate_proj;  up [Fl, C]  rows of up_proj;  down [C, Fl]  columns of
//   down_proj [C, F].
//   up follows gate directly, so [gate; up] is one [2·Fl, C] matrix (TspMlp's fused GEMM).
// Gradients use the same packing.
#pragma once

#include <cstddef>
#include <span>

#include "tspemu/reference/model.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {

template <class P>  // P = T* or const T*
struct AttentionShardView {
  P wq, wk, wv, wo;
};
template <class P>
struct MlpShardView {
  P gate, up, down;
};

std::size_t attention_shard_size(const TspShape& s);
std::size_t mlp_shard_size(const TspShape& s);
// T = float or double, here and below.
template <class T>
AttentionShardView<T*> attention_view(T* packed, const TspShape& s);
template <class T>
AttentionShardView<const T*> attention_view(const T* packed, const TspShape& s);
template <class T>
MlpShardView<T*> mlp_view(T* packed, const TspShape& s);
template <class T>
MlpShardView<const T*> mlp_view(const T* packed, const TspShape& s);

// Cut shard r of the master layer into `packed`.
template <class T>
void pack_attention_shard(const ref::LayerWeights<T>& master, const TspShape& s, int r, T* packed);
template <class T>
void pack_mlp_shard(const ref::LayerWeights<T>& master, const TspShape& s, int r, T* packed);
// Write shard r back into full-size tensors (for gradients gathered from every rank).
template <class T>
void unpack_attention_shard(const T* packed, const TspShape& s, int r, ref::LayerWeights<T>& full);
template <class T>
void unpack_mlp_shard(const T* packed, const TspShape& s, int r, ref::LayerWeights<T>& full);

// What a rank holds of one layer (its weights or their gradients): the packed attention and
// MLP shards and the two norm weights, whole.
template <class T>
struct PackedLayer {
  std::span<const T> attention, input_norm, mlp, post_norm;
};
// Writes a rank's layer back into full-size tensors: shard r of the attention and the MLP when
// `shards`, the norms when `norms`. Replicas hold equal values, so callers let one replica write
// each shard and one rank the norms: the ranks then write disjoint elements, concurrently.
template <class T>
void unpack_layer(const PackedLayer<T>& layer, const TspShape& s, int r, bool shards, bool norms,
                  ref::LayerWeights<T>& full);

}  // namespace tspemu::tsp
