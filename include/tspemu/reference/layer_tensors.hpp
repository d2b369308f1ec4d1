// The table of a transformer layer's parameter tensors: the one list of their names, blocks,
// shapes and head axes, read by LayerWeights (model.hpp), the Hugging Face names of
// ref::parameters (and so the checkpoint loaders), the check kit and the command line.
//
// What: kLayerTensors holds the nine tensors of a layer in LayerWeights' declaration order — the
// attention block's five (input_norm, wq, wk, wv, wo), then the MLP block's four (post_norm,
// w_gate, w_up, w_down). Each row names the tensor as a LayerWeights field and as the checkpoint
// names it under "model.layers.N.", its block, and its shape as a matrix [rows, cols] in
// PyTorch Linear layout ([out, in]; a norm weight is the vector [C], viewed as [1, C]).
// Head axis: q/k/v's rows and o_proj's columns are heads × head_size; the row says which axis
// and whether the query or the key/value heads count them (tensor parallelism cuts there).
// Guarantees: the table is constexpr and fixed; layer_tensor_shape is pure.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "tspemu/reference/model_config.hpp"

namespace tspemu::ref {

enum class LayerBlock { attention, mlp };

// A dimension of a layer tensor, in terms of the model config.
enum class LayerDim { one, hidden, ffn, q_dim, kv_dim };

struct LayerTensor {
  const char* name;     // the LayerWeights field: "wq"
  const char* hf_name;  // under "model.layers.N.": "self_attn.q_proj.weight"
  LayerBlock block;
  LayerDim rows, cols;    // [rows, cols]; rows == one: the vector [cols]
  int head_axis = -1;     // -1: none; 0: rows are heads × head_size; 1: the columns are
  bool kv_heads = false;  // the head axis counts the key/value heads (else the query heads)
};

inline constexpr std::array<LayerTensor, 9> kLayerTensors{{
    {"input_norm", "input_layernorm.weight", LayerBlock::attention, LayerDim::one,
     LayerDim::hidden},
    {"wq", "self_attn.q_proj.weight", LayerBlock::attention, LayerDim::q_dim, LayerDim::hidden, 0},
    {"wk", "self_attn.k_proj.weight", LayerBlock::attention, LayerDim::kv_dim, LayerDim::hidden, 0,
     true},
    {"wv", "self_attn.v_proj.weight", LayerBlock::attention, LayerDim::kv_dim, LayerDim::hidden, 0,
     true},
    {"wo", "self_attn.o_proj.weight", LayerBlock::attention, LayerDim::hidden, LayerDim::q_dim, 1},
    {"post_norm", "post_attention_layernorm.weight", LayerBlock::mlp, LayerDim::one,
     LayerDim::hidden},
    {"w_gate", "mlp.gate_proj.weight", LayerBlock::mlp, LayerDim::ffn, LayerDim::hidden},
    {"w_up", "mlp.up_proj.weight", LayerBlock::mlp, LayerDim::ffn, LayerDim::hidden},
    {"w_down", "mlp.down_proj.weight", LayerBlock::mlp, LayerDim::hidden, LayerDim::ffn},
}};

// A layer tensor's shape under a config: [rows, cols] (rows 1 for a norm), and the number of
// heads along its head axis (0 without one).
struct LayerTensorShape {
  std::int64_t rows = 1, cols = 1;
  std::int64_t heads = 0;
  int head_axis = 0;
  std::int64_t size() const { return rows * cols; }
};

inline std::int64_t layer_dim(const ModelConfig& cfg, LayerDim d) {
  switch (d) {
    case LayerDim::one:
      return 1;
    case LayerDim::hidden:
      return cfg.hidden;
    case LayerDim::ffn:
      return cfg.ffn;
    case LayerDim::q_dim:
      return cfg.q_dim();
    case LayerDim::kv_dim:
      return cfg.kv_dim();
  }
  return 0;
}

inline LayerTensorShape layer_tensor_shape(const ModelConfig& cfg, const LayerTensor& t) {
  LayerTensorShape s{layer_dim(cfg, t.rows), layer_dim(cfg, t.cols)};
  if (t.head_axis >= 0) {
    s.heads = t.kv_heads ? cfg.n_kv_heads : cfg.n_heads;
    s.head_axis = t.head_axis;
  }
  return s;
}

// The row named `name` (a LayerWeights field name), or null.
inline const LayerTensor* find_layer_tensor(std::string_view name) {
  for (const LayerTensor& t : kLayerTensors)
    if (name == t.name) return &t;
  return nullptr;
}

}  // namespace tspemu::ref
