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
// Gradients use the same packing.
#pragma once

#include <cstddef>

#include "tspemu/reference/model.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {

template <class P>  // P = float* or const float*
struct AttentionShardView {
  P wq, wk, wv, wo;
};
template <class P>
struct MlpShardView {
  P gate, up, down;
};

std::size_t attention_shard_size(const TspShape& s);
std::size_t mlp_shard_size(const TspShape& s);
AttentionShardView<float*> attention_view(float* packed, const TspShape& s);
AttentionShardView<const float*> attention_view(const float* packed, const TspShape& s);
MlpShardView<float*> mlp_view(float* packed, const TspShape& s);
MlpShardView<const float*> mlp_view(const float* packed, const TspShape& s);

// Cut shard r of the master layer into `packed`.
void pack_attention_shard(const ref::LayerWeights<float>& master, const TspShape& s, int r,
                          float* packed);
void pack_mlp_shard(const ref::LayerWeights<float>& master, const TspShape& s, int r,
                    float* packed);
// Write shard r back into full-size tensors (for gradients gathered from every rank).
void unpack_attention_shard(const float* packed, const TspShape& s, int r,
                            ref::LayerWeights<float>& full);
void unpack_mlp_shard(const float* packed, const TspShape& s, int r,
                      ref::LayerWeights<float>& full);

}  // namespace tspemu::tsp
