// A Hugging Face Llama checkpoint directory, read and written.
//
// What: DIR/config.json (hf_llama_config.hpp) plus the weights, either one DIR/model.safetensors
//   or shards listed by DIR/model.safetensors.index.json ({"metadata": {...}, "weight_map":
//   {tensor name: shard file name}}), in HF Llama names and layout: model.embed_tokens.weight
//   [V, C], model.layers.N.self_attn.{q,k,v,o}_proj.weight and mlp.{gate,up,down}_proj.weight as
//   torch Linear [out, in], model.layers.N.{input,post_attention}_layernorm.weight [C],
//   model.norm.weight [C], lm_head.weight [V, C] unless tie_word_embeddings — the names and
//   shapes of ModelWeights (model.hpp), so no tensor is renamed or transposed.
//   RoPE: HF Llama's q_proj/k_proj rows are laid out for the rotate-half convention (dimension i
//   of a head pairs with i + hs/2: transformers/models/llama/modeling_llama.py, rotate_half and
//   apply_rotary_pos_emb), which is the convention of tspemu's RoPE (rope.hpp), so rows are read
//   and written as they are. (Meta's original consolidated.*.pth pair dimensions 2i, 2i+1; HF's
//   convert_llama_weights_to_hf.py permutes their rows into the HF layout — such checkpoints are
//   not read here.) tests/reference/torch_hf_checkpoint.py runs a rotate-half forward in PyTorch
//   on a saved checkpoint and matches tspemu's logits, which checks this end to end.
// Requirements: none on the directory's contents; any bytes are handled.
// Guarantees (load): everything is checked before any weight is converted or the model
//   allocated — the config, the index (a JSON object nested at most 3 deep, no key twice, a
//   weight_map of tensor name -> plain file name with no '/' or '..'), every shard it names
//   (SafetensorsReader's checks), every tensor the config implies present exactly once in the
//   file the index names with the config's shape and a dtype F32, F64, F16 or BF16 (converted
//   exactly, then rounded to T), no other tensor and every weight finite unless
//   opts.allow_nonfinite (load_model's rules, safetensors.hpp). Errors: HfConfigError
//   for config.json, SafetensorsError for a shard and its tensors, CheckpointError for the
//   directory and the index; each names the file and the tensor or key. A directory holding both
//   model.safetensors and the index is refused as ambiguous.
// Guarantees (save): writes config.json and the weights in T's dtype (F32 or F64) with metadata
//   {"format": "pt"} (transformers requires it): one model.safetensors when the tensors fit in
//   max_shard_bytes (0: no limit), else model-0000i-of-0000n.safetensors filled in parameter
//   order, a new shard started when the next tensor would pass the limit (a larger tensor alone),
//   and the index with metadata.total_size (the tensors' bytes), as transformers'
//   save_pretrained does. Every file is written whole to a temporary beside it before any is
//   renamed into place (core/atomic_file.hpp, StagedFiles), so a failure — or a SIGINT / SIGTERM
//   deferred by the caller's SignalDeferral — leaves the old checkpoint and no temporary;
//   afterwards the weight files of an earlier save that this one did not write are removed, so the
//   directory reads back as exactly what was saved — bitwise, by load_hf_checkpoint<T>.
// Cost: load holds every shard's bytes at once (test-sized models; not multi-GB checkpoints) and
//   converts each tensor once; save holds each shard's bytes once more.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/reference/model.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::ref {

struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T>  // float or double
ModelWeights<T> load_hf_checkpoint(const std::string& dir, LoadOptions opts = {});

// Returns the files written, in the order written (shards, then the index, then config.json).
template <class T>
std::vector<std::string> save_hf_checkpoint(const std::string& dir, const ModelWeights<T>& w,
                                            std::uint64_t max_shard_bytes = 0);

}  // namespace tspemu::ref
