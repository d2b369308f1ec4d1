// Hugging Face Llama `config.json` <-> ModelConfig.
//
// What: the hyper-parameters of a `LlamaForCausalLM` checkpoint as transformers writes them
//   (transformers/models/llama/configuration_llama.py, LlamaConfig), mapped to ModelConfig:
//     hidden_size -> hidden            num_attention_heads -> n_heads
//     num_key_value_heads -> n_kv_heads (absent or null: num_attention_heads, as LlamaConfig)
//     intermediate_size -> ffn         vocab_size -> vocab        num_hidden_layers -> n_layers
//     rms_norm_eps -> norm_eps (absent: 1e-6)   rope_theta -> rope_base (absent: 10000)
//     tie_word_embeddings -> tie_embeddings (absent: false)
//   head_dim, when present and not null, must equal hidden_size / num_attention_heads (tspemu's
//   attention projects to the hidden size).
// Requirements: none; any bytes are handled.
// Guarantees: the result is a config ModelConfig::validate() accepts, whose parameter count fits
//   in 2^53; everything else throws HfConfigError naming the key, the value (sanitized, at most 64
//   bytes) and the file when read from one. Refused:
//   - not a JSON object; JSON nested deeper than 8 levels (refused while parsing, so depth costs
//     no stack); a key twice in one object; text over 1 MiB;
//   - model_type missing or not "llama"; architectures present and not ["LlamaForCausalLM"];
//   - an integer field that is not a JSON integer (1.0, "16", true are refused) or not in
//     [1, 2^31-1]; a float field that is not a finite positive number; a bool field not a bool;
//   - options tspemu does not implement, unless they have the value that means "off":
//     rope_scaling (null), attention_bias (false), mlp_bias (false), hidden_act ("silu"),
//     pretraining_tp (1), attention_dropout (0), quantization_config (absent);
//   - any key not in the lists above or in the metadata keys that do not change the model
//     (bos/eos/pad token ids, max_position_embeddings, initializer_range, use_cache, torch_dtype,
//     transformers_version, _name_or_path, ...): an unknown key might change the model, and
//     a silently different model is the failure this reader exists to prevent.
//   llama_config_to_json writes a config this reader reads back to the same ModelConfig (floats
//   as shortest round-trip decimals), in the form transformers' LlamaConfig.from_dict accepts.
// Cost: one parse of the text.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "tspemu/reference/model_config.hpp"

namespace tspemu::ref {

struct HfConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `source` names the file in errors ("" for none).
ModelConfig llama_config_from_json(std::string_view text, const std::string& source = "");
// Reads and parses the file at path (a directory or unreadable file is an HfConfigError).
ModelConfig read_llama_config(const std::string& path);
// config.json text for cfg (validated first), with architectures, model_type and the off values
// of the options above written out.
std::string llama_config_to_json(const ModelConfig& cfg);

}  // namespace tspemu::ref
