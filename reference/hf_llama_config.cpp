#include "tspemu/reference/hf_llama_config.hpp"

#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "strict_json.hpp"
#include "tspemu/core/sanitized.hpp"

namespace tspemu::ref {

namespace {

using Json = nlohmann::json;

constexpr std::size_t kMaxText = 1u << 20;  // real configs are about 1 KB
// Containers nested in a real config: the object, an option object (rope_scaling,
// quantization_config) and an array inside it. 8 leaves room and bounds the parser's recursion.
constexpr int kMaxDepth = 8;

// Keys transformers writes that do not change the model's arithmetic.
const std::set<std::string>& inert_keys() {
  static const std::set<std::string> keys = {"_name_or_path",
                                             "bos_token_id",
                                             "eos_token_id",
                                             "pad_token_id",
                                             "max_position_embeddings",
                                             "initializer_range",
                                             "use_cache",
                                             "torch_dtype",
                                             "dtype",
                                             "transformers_version",
                                             "output_attentions",
                                             "output_hidden_states",
                                             "return_dict",
                                             "tokenizer_class",
                                             "is_encoder_decoder",
                                             "max_length",
                                             "min_length",
                                             "use_return_dict"};
  return keys;
}

class Parser {
 public:
  Parser(const Json& j, std::string source) : j_(j), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw HfConfigError("config.json: " + what +
                        (source_.empty() ? "" : " (file '" + sanitized(source_, 256) + "')"));
  }

  std::string value_text(const Json& v) const {
    return sanitized(v.dump(-1, ' ', false, Json::error_handler_t::replace));
  }

  // The key's value, or nullptr when absent (or null, if null_is_absent).
  const Json* find(const char* key, bool null_is_absent = false) const {
    used_.insert(key);
    const auto it = j_.find(key);
    if (it == j_.end() || (null_is_absent && it->is_null())) return nullptr;
    return &*it;
  }

  int integer(const char* key, const Json& v) const {
    if (!v.is_number_integer()) {
      fail("'" + std::string(key) + "'=" + value_text(v) + " is not a JSON integer");
    }
    // An unsigned JSON integer may exceed int64: compare it unsigned.
    const bool in_range =
        v.is_number_unsigned()
            ? v.get<std::uint64_t>() >= 1 &&
                  v.get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<int>::max())
            : v.get<std::int64_t>() >= 1 &&
                  v.get<std::int64_t>() <= std::numeric_limits<int>::max();
    if (!in_range) {
      fail("'" + std::string(key) + "'=" + value_text(v) + " is not in [1, 2147483647]");
    }
    return int(v.get<std::int64_t>());
  }
  int required_int(const char* key) const {
    const Json* v = find(key);
    if (v == nullptr) fail("lacks the required key '" + std::string(key) + "'");
    return integer(key, *v);
  }
  double positive(const char* key, double fallback) const {
    const Json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || !(v->get<double>() > 0)) {
      fail("'" + std::string(key) + "'=" + value_text(*v) + " is not a finite positive number");
    }
    return v->get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    const Json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail("'" + std::string(key) + "'=" + value_text(*v) + " is not a bool");
    return v->get<bool>();
  }
  // An option tspemu does not implement: accepted only absent or with its "off" value.
  void off(const char* key, const Json& off_value, const char* what) const {
    const Json* v = find(key);
    if (v == nullptr || *v == off_value) return;
    fail("unsupported option '" + std::string(key) + "'=" + value_text(*v) + ": " + what +
         "; tspemu implements only " + value_text(off_value));
  }
  void no_unknown_keys() const {
    for (const auto& [key, value] : j_.items()) {
      if (used_.count(key) == 0 && inert_keys().count(key) == 0) {
        fail("unknown key '" + sanitized(key) + "'=" + value_text(value) +
             ": tspemu cannot tell whether it changes the model, so it refuses the config");
      }
    }
  }

 private:
  const Json& j_;
  std::string source_;
  mutable std::set<std::string> used_;
};

ModelConfig parse(const Json& j, const std::string& source) {
  if (!j.is_object()) {
    throw HfConfigError("config.json: not a JSON object" +
                        (source.empty() ? "" : " (file '" + sanitized(source, 256) + "')"));
  }
  const Parser p(j, source);
  const Json* type = p.find("model_type");
  if (type == nullptr) p.fail("lacks 'model_type' (tspemu reads model_type \"llama\")");
  if (*type != "llama") {
    p.fail("model_type " + p.value_text(*type) + " is not supported (only \"llama\")");
  }
  if (const Json* arch = p.find("architectures", true);
      arch != nullptr && *arch != Json::array({"LlamaForCausalLM"})) {
    p.fail("architectures " + p.value_text(*arch) +
           " is not supported (only [\"LlamaForCausalLM\"])");
  }
  ModelConfig c;
  c.hidden = p.required_int("hidden_size");
  c.n_heads = p.required_int("num_attention_heads");
  c.ffn = p.required_int("intermediate_size");
  c.vocab = p.required_int("vocab_size");
  c.n_layers = p.required_int("num_hidden_layers");
  const Json* kv = p.find("num_key_value_heads", true);
  c.n_kv_heads = kv ? p.integer("num_key_value_heads", *kv) : c.n_heads;
  c.norm_eps = p.positive("rms_norm_eps", 1e-6);
  c.rope_base = p.positive("rope_theta", 10000.0);
  c.tie_embeddings = p.boolean("tie_word_embeddings", false);
  if (const Json* hd = p.find("head_dim", true)) {
    const int head_dim = p.integer("head_dim", *hd);
    if (c.hidden % c.n_heads != 0 || head_dim != c.hidden / c.n_heads) {
      p.fail("'head_dim'=" + std::to_string(head_dim) + " is not hidden_size " +
             std::to_string(c.hidden) + " / num_attention_heads " + std::to_string(c.n_heads) +
             " (tspemu's attention projects to the hidden size)");
    }
  }
  // rope_scaling {"rope_type": "default"} (or the older "type") is no scaling, as null is.
  if (const Json* rs = p.find("rope_scaling", true);
      rs != nullptr && *rs != Json{{"rope_type", "default"}} && *rs != Json{{"type", "default"}}) {
    p.fail("unsupported option 'rope_scaling'=" + p.value_text(*rs) +
           ": RoPE scaling is not implemented; tspemu implements only null");
  }
  p.off("attention_bias", false, "biases in q/k/v/o_proj are not implemented");
  p.off("mlp_bias", false, "biases in gate/up/down_proj are not implemented");
  p.off("hidden_act", "silu", "the gated MLP uses SiLU only");
  p.off("pretraining_tp", 1, "sliced projections are not implemented");
  if (const Json* drop = p.find("attention_dropout");
      drop != nullptr && !(drop->is_number() && drop->get<double>() == 0.0)) {
    p.fail("unsupported option 'attention_dropout'=" + p.value_text(*drop) +
           ": dropout is not implemented; tspemu implements only 0");
  }
  p.off("quantization_config", nullptr, "quantized weights are not implemented");
  p.no_unknown_keys();
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    p.fail(std::string("describes an invalid model: ") + e.what());
  }
  // Every tensor size and the total must stay exact in the size_t and double arithmetic that
  // follows (allocation, the planner): 2^53 parameters is far above any real model.
  const double C = c.hidden, F = c.ffn, V = c.vocab, kv_dim = double(c.kv_dim());
  const double per_layer = 2 * C + 2 * C * C + 2 * kv_dim * C + 3 * F * C;
  const double total = c.n_layers * per_layer + C + V * C * (c.tie_embeddings ? 1 : 2);
  if (total > 0x1p53) {
    p.fail("describes " + std::to_string(total) + " parameters, more than 2^53 (" + c.to_string() +
           ")");
  }
  return c;
}

}  // namespace

ModelConfig llama_config_from_json(std::string_view text, const std::string& source) {
  const auto fail = [&](const std::string& reason) {
    throw HfConfigError("config.json: " + reason +
                        (source.empty() ? "" : " (file '" + sanitized(source, 256) + "')"));
  };
  if (text.size() > kMaxText) {
    fail(std::to_string(text.size()) + " bytes, more than the 1 MiB a config can need");
  }
  const Json j = detail::parse_strict_json(text, kMaxDepth, fail);
  try {
    return parse(j, source);
  } catch (const Json::exception& e) {  // every access is type-checked first: unexpected
    fail(e.what());
  }
  return {};  // unreachable: fail throws
}

ModelConfig read_llama_config(const std::string& path) {
  return llama_config_from_json(
      detail::read_bounded_file(path, kMaxText,
                                [&](const std::string& reason) {
                                  throw HfConfigError("config.json: cannot read '" +
                                                      sanitized(path, 256) + "': " + reason);
                                }),
      path);
}

std::string llama_config_to_json(const ModelConfig& cfg) {
  cfg.validate();
  const Json j = {{"architectures", {"LlamaForCausalLM"}},
                  {"model_type", "llama"},
                  {"hidden_size", cfg.hidden},
                  {"intermediate_size", cfg.ffn},
                  {"num_attention_heads", cfg.n_heads},
                  {"num_key_value_heads", cfg.n_kv_heads},
                  {"head_dim", cfg.head_size()},
                  {"num_hidden_layers", cfg.n_layers},
                  {"vocab_size", cfg.vocab},
                  {"rms_norm_eps", cfg.norm_eps},
                  {"rope_theta", cfg.rope_base},
                  {"rope_scaling", nullptr},
                  {"tie_word_embeddings", cfg.tie_embeddings},
                  {"hidden_act", "silu"},
                  {"attention_bias", false},
                  {"mlp_bias", false},
                  {"attention_dropout", 0.0},
                  {"pretraining_tp", 1}};
  return j.dump(2) + "\n";
}

}  // namespace tspemu::ref
