// ModelConfig: the shape of a Llama-style decoder-only transformer.
//
// What: the hyper-parameters every reference entry point takes, and their validation.
// Requirements: call validate() before use; every entry point in tspemu::ref assumes a valid
// config. Guarantees: validate() throws std::invalid_argument naming the offending field and its
// value,
//   e.g. "ModelConfig: n_heads=12 does not divide hidden=100".
//
// Dimension letters used throughout include/tspemu/reference (defined once, here):
//   B   batch size                     T   sequence length (tokens per sequence)
//   C   hidden size (= hidden)         V   vocabulary size (= vocab)
//   NH  query heads (= n_heads)        NKV key/value heads (= n_kv_heads), NH % NKV == 0
//   hs  head size = C / NH (even: RoPE rotates pairs)
//   F   MLP intermediate size (= ffn)  L   number of layers (= n_layers)
#pragma once

#include <cstdint>
#include <string>

namespace tspemu::ref {

struct ModelConfig {
  int vocab = 0;       // V
  int hidden = 0;      // C
  int n_layers = 0;    // L
  int n_heads = 0;     // NH
  int n_kv_heads = 0;  // NKV; NH / NKV query heads share one K/V head (grouped-query attention)
  int ffn = 0;         // F, gated MLP width
  double rope_base = 10000.0;
  double norm_eps = 1e-5;
  bool tie_embeddings = false;  // lm_head.weight is model.embed_tokens.weight

  int head_size() const { return hidden / n_heads; }       // hs
  int q_dim() const { return n_heads * head_size(); }      // NH*hs (== C)
  int kv_dim() const { return n_kv_heads * head_size(); }  // NKV*hs

  // Throws std::invalid_argument naming the first violated requirement.
  void validate() const;
  // One line, e.g. "V=32 C=16 L=2 NH=4 NKV=2 F=40 rope_base=10000 norm_eps=1e-05 tied=0".
  std::string to_string() const;
};

}  // namespace tspemu::ref
