// Hugging Face Llama config.json: every field read and validated, the key named in every error,
// unsupported options and unknown keys refused, and the writer's output read back unchanged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "tspemu/reference/hf_llama_config.hpp"

namespace tspemu::ref {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// A TinyLlama-1.1B config.json as transformers 4.35 writes it, shrunk.
Json tiny_llama_json() {
  return Json::parse(R"({
    "_name_or_path": "tiny",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 176,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 8,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": null,
    "rope_theta": 500000.0,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.35.0",
    "use_cache": true,
    "vocab_size": 96
  })");
}

// The HfConfigError message for j ("" and a test failure if it is accepted).
std::string error_of(const std::string& text) {
  try {
    const ModelConfig c = llama_config_from_json(text);
    ADD_FAILURE() << "accepted as " << c.to_string() << ":\n" << text;
  } catch (const HfConfigError& e) {
    return e.what();
  }
  return "";
}
std::string error_with(const std::string& key, const Json& value) {
  Json j = tiny_llama_json();
  j[key] = value;
  return error_of(j.dump());
}

TEST(HfLlamaConfig, ReadsEveryFieldOfATransformersConfig) {
  const ModelConfig c = llama_config_from_json(tiny_llama_json().dump());
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.ffn, 176);
  EXPECT_EQ(c.vocab, 96);
  EXPECT_EQ(c.n_layers, 3);
  EXPECT_EQ(c.norm_eps, 1e-05);
  EXPECT_EQ(c.rope_base, 500000.0);
  EXPECT_FALSE(c.tie_embeddings);
  Json j = tiny_llama_json();
  j["tie_word_embeddings"] = true;
  j["head_dim"] = 8;  // consistent with 64 / 8
  EXPECT_TRUE(llama_config_from_json(j.dump()).tie_embeddings);
}

TEST(HfLlamaConfig, AbsentOptionalKeysTakeLlamaConfigDefaults) {
  Json j = tiny_llama_json();
  for (const char* k : {"rms_norm_eps", "rope_theta", "tie_word_embeddings", "architectures",
                        "attention_bias", "hidden_act", "rope_scaling"})
    j.erase(k);
  j["num_key_value_heads"] = nullptr;  // transformers: None means num_attention_heads
  const ModelConfig c = llama_config_from_json(j.dump());
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.rope_base, 10000.0);
  EXPECT_FALSE(c.tie_embeddings);
}

TEST(HfLlamaConfig, RefusesOtherModelTypesAndArchitecturesNamingThem) {
  EXPECT_THAT(error_with("model_type", "mistral"),
              HasSubstr("model_type \"mistral\" is not supported"));
  EXPECT_THAT(error_with("architectures", Json::array({"LlamaModel"})),
              HasSubstr("architectures [\"LlamaModel\"] is not supported"));
  EXPECT_THAT(error_with("architectures", Json::array({"LlamaForCausalLM", "X"})),
              HasSubstr("architectures"));
  Json j = tiny_llama_json();
  j.erase("model_type");
  EXPECT_THAT(error_of(j.dump()), HasSubstr("lacks 'model_type'"));
}

TEST(HfLlamaConfig, RefusesUnsupportedOptionsNamingThem) {
  EXPECT_THAT(error_with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}),
              HasSubstr("unsupported option 'rope_scaling'={\"factor\":8.0,\"rope_type\":"));
  EXPECT_THAT(error_with("rope_scaling", {{"type", "linear"}, {"factor", 2}}),
              HasSubstr("RoPE scaling is not implemented"));
  EXPECT_THAT(error_with("attention_bias", true),
              HasSubstr("unsupported option 'attention_bias'=true"));
  EXPECT_THAT(error_with("mlp_bias", true), HasSubstr("unsupported option 'mlp_bias'=true"));
  EXPECT_THAT(error_with("hidden_act", "gelu"),
              HasSubstr("unsupported option 'hidden_act'=\"gelu\""));
  EXPECT_THAT(error_with("pretraining_tp", 2), HasSubstr("'pretraining_tp'=2"));
  EXPECT_THAT(error_with("attention_dropout", 0.1), HasSubstr("'attention_dropout'=0.1"));
  EXPECT_THAT(error_with("quantization_config", {{"quant_method", "gptq"}}),
              HasSubstr("unsupported option 'quantization_config'"));
  // The values that mean "off" are accepted.
  for (const Json& off : {Json(nullptr), Json{{"rope_type", "default"}}}) {
    Json j = tiny_llama_json();
    j["rope_scaling"] = off;
    EXPECT_NO_THROW(llama_config_from_json(j.dump())) << off;
  }
}

TEST(HfLlamaConfig, RefusesUnknownKeysNamingThem) {
  EXPECT_THAT(error_with("sliding_window", 4096),
              HasSubstr("unknown key 'sliding_window'=4096: tspemu cannot tell"));
}

TEST(HfLlamaConfig, IntegerFieldsMustBeJsonIntegersInIntRange) {
  for (const char* key : {"hidden_size", "num_attention_heads", "num_key_value_heads",
                          "intermediate_size", "vocab_size", "num_hidden_layers", "head_dim"}) {
    for (const Json& v : {Json(64.0), Json("64"), Json(true), Json::array({64})}) {
      EXPECT_THAT(error_with(key, v),
                  HasSubstr("'" + std::string(key) + "'=" + v.dump() + " is not a JSON integer"));
    }
    for (const Json& v : {Json(0), Json(-1), Json(2147483648LL), Json(18446744073709551615ULL)}) {
      EXPECT_THAT(error_with(key, v), HasSubstr("'" + std::string(key) + "'=" + v.dump() +
                                                " is not in [1, 2147483647]"));
    }
  }
  Json j = tiny_llama_json();
  j.erase("vocab_size");
  EXPECT_THAT(error_of(j.dump()), HasSubstr("lacks the required key 'vocab_size'"));
  EXPECT_THAT(error_with("hidden_size", nullptr), HasSubstr("'hidden_size'=null"));
  // A number too large for any integer type is parsed as a float: refused as not an integer.
  EXPECT_THAT(error_of(R"({"model_type": "llama", "hidden_size": 100000000000000000000000})"),
              HasSubstr("is not a JSON integer"));
}

TEST(HfLlamaConfig, FloatFieldsMustBeFinitePositiveNumbers) {
  for (const char* key : {"rms_norm_eps", "rope_theta"}) {
    for (const Json& v : {Json(0.0), Json(-1e-5), Json("1e-5"), Json(true), Json(nullptr)}) {
      EXPECT_THAT(error_with(key, v), HasSubstr("'" + std::string(key) + "'=" + v.dump() +
                                                " is not a finite positive number"));
    }
  }
  // JSON has no infinity; a literal out of double's range, the way to write one, is refused.
  EXPECT_THAT(error_of(R"({"model_type": "llama", "rms_norm_eps": 1e999})"),
              HasSubstr("not valid JSON"));
  EXPECT_THAT(error_with("tie_word_embeddings", 1), HasSubstr("'tie_word_embeddings'=1 is not"));
  EXPECT_THAT(error_with("tie_word_embeddings", "true"), HasSubstr("is not a bool"));
}

TEST(HfLlamaConfig, RefusesInconsistentShapesNamingTheValues) {
  EXPECT_THAT(error_with("head_dim", 16), HasSubstr("'head_dim'=16 is not hidden_size 64 / "
                                                    "num_attention_heads 8"));
  EXPECT_THAT(error_with("num_key_value_heads", 3),
              HasSubstr("invalid model: ModelConfig: n_kv_heads=3 does not divide n_heads=8"));
  EXPECT_THAT(error_with("num_attention_heads", 7), HasSubstr("does not divide hidden=64"));
  // Every size in range, but the parameter count is not exact in double.
  Json j = tiny_llama_json();
  j["hidden_size"] = 2147483644;
  j["num_attention_heads"] = 2;
  j["num_key_value_heads"] = 2;
  j["intermediate_size"] = 2147483647;
  EXPECT_THAT(error_of(j.dump()), HasSubstr("parameters, more than 2^53"));
}

TEST(HfLlamaConfig, RefusesMalformedJsonDuplicateKeysAndDeepNesting) {
  EXPECT_THAT(error_of("{"), HasSubstr("not valid JSON"));
  EXPECT_THAT(error_of("[1]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(error_of(R"({"model_type": "llama", "hidden_size": 64, "hidden_size": 32})"),
              HasSubstr("duplicate key 'hidden_size'"));
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_THAT(error_of(R"({"model_type": "llama", "x": )" + deep + "}"),
              HasSubstr("nests deeper than 8 levels"));
  EXPECT_THAT(error_of(std::string((1 << 20) + 1, ' ')), HasSubstr("more than the 1 MiB"));
}

TEST(HfLlamaConfig, FileErrorsNameTheFile) {
  const std::string dir = ::testing::TempDir() + "hf_config_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  EXPECT_THROW(
      {
        try {
          read_llama_config(dir);
        } catch (const HfConfigError& e) {
          EXPECT_THAT(e.what(), HasSubstr("cannot read '" + dir + "': not a regular file"));
          throw;
        }
      },
      HfConfigError);
  EXPECT_THROW(read_llama_config(dir + "/absent.json"), HfConfigError);
  const std::string path = dir + "/config.json";
  std::ofstream(path) << R"({"model_type": "gpt2"})";
  try {
    read_llama_config(path);
    ADD_FAILURE() << "gpt2 accepted";
  } catch (const HfConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("(file '" + path + "')"));
  }
  std::filesystem::remove_all(dir);
}

TEST(HfLlamaConfig, WrittenConfigReadsBackToTheSameConfig) {
  ModelConfig c = testing::tiny_gqa_config();
  c.norm_eps = 1.0 / 3.0e5;  // not a short decimal: the writer must keep every bit
  c.rope_base = 123456.789;
  for (const bool tied : {false, true}) {
    c.tie_embeddings = tied;
    const ModelConfig back = llama_config_from_json(llama_config_to_json(c));
    EXPECT_EQ(back.to_string(), c.to_string());
    EXPECT_EQ(back.norm_eps, c.norm_eps);
    EXPECT_EQ(back.rope_base, c.rope_base);
  }
}

}  // namespace
}  // namespace tspemu::ref
