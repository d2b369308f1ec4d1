// Model checkpoints in safetensors: the config metadata is parsed strictly, and load_model checks
// the whole file against the config before allocating anything, naming the file in its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::ref {
namespace {

using ::testing::HasSubstr;

// The SafetensorsError message of config_from_metadata on the tiny config's metadata with
// md[key] = value ("" and a test failure if it is accepted).
std::string metadata_error(const std::string& key, const std::string& value) {
  auto md = config_to_metadata(testing::tiny_gqa_config());
  md[key] = value;
  try {
    const ModelConfig c = config_from_metadata(md);
    ADD_FAILURE() << key << "='" << value << "' accepted as " << c.to_string();
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsModel, ConfigMetadataIntegersMustBeWholeDecimalNumbersInIntRange) {
  for (const std::string v : {"12abc", "4.9", "1e3", " 16", "16 ", "", "+16", "0x10", "2147483648",
                              "-2147483649", "99999999999999999999"}) {
    EXPECT_THAT(metadata_error("hidden", v), HasSubstr("'hidden'='" + v + "' is not"));
  }
  EXPECT_THAT(metadata_error("n_layers", "1e3"),
              HasSubstr("metadata field 'n_layers'='1e3' is not a decimal integer"));
}

TEST(SafetensorsModel, ConfigMetadataNormEpsAndRopeBaseMustBeFiniteAndPositive) {
  for (const std::string v :
       {"inf", "-inf", "nan", "infinity", "0", "-1e-5", "1e-5x", "1e999", " 1e-5", ""}) {
    EXPECT_THAT(metadata_error("norm_eps", v), HasSubstr("'norm_eps'='" + v + "'"));
  }
  EXPECT_THAT(metadata_error("norm_eps", "inf"), HasSubstr("a finite positive number"));
  EXPECT_THAT(metadata_error("rope_base", "nan"), HasSubstr("'rope_base'='nan'"));
  EXPECT_THAT(metadata_error("rope_base", "-10000"), HasSubstr("'rope_base'='-10000'"));
}

TEST(SafetensorsModel, ConfigMetadataTieEmbeddingsIsZeroOrOne) {
  for (const std::string v : {"2", "-1", "true", "01", ""}) {
    EXPECT_THAT(metadata_error("tie_embeddings", v),
                HasSubstr("'tie_embeddings'='" + v + "' is not 0 or 1"));
  }
  for (const bool tied : {false, true}) {
    ModelConfig c = testing::tiny_gqa_config();
    c.tie_embeddings = tied;
    EXPECT_EQ(config_from_metadata(config_to_metadata(c)).tie_embeddings, tied);
  }
}

TEST(SafetensorsModel, ConfigMetadataDescribingAnInvalidModelIsRejected) {
  EXPECT_THAT(metadata_error("n_heads", "3"),
              HasSubstr("invalid model config: ModelConfig: n_heads=3 does not divide hidden=16"));
  EXPECT_THAT(metadata_error("vocab", "0"), HasSubstr("vocab=0 must be positive"));
}

TEST(SafetensorsModel, ConfigMetadataQuotesAShortPrefixOfALongValue) {
  const std::string msg = metadata_error("ffn", std::string(100000, '7') + "x");
  EXPECT_THAT(msg, HasSubstr("'ffn'='7777777"));
  EXPECT_LT(msg.size(), 300u) << msg.substr(0, 300);
}

// A file holding nothing but cfg in its metadata (a few hundred bytes).
SafetensorsReader metadata_only_file(const ModelConfig& cfg) {
  SafetensorsWriter wr;
  for (const auto& [k, v] : config_to_metadata(cfg)) wr.set_metadata(k, v);
  return SafetensorsReader::from_bytes(wr.to_bytes());
}

// Each of these configs needs far more memory than any machine has (the first 512 TB in one
// tensor, the second 2e9 layers), so allocating before checking the file throws std::bad_alloc.
TEST(SafetensorsModel, LoadModelChecksTheFileBeforeAllocatingAHugeConfig) {
  ModelConfig wide = testing::tiny_gqa_config();
  wide.vocab = 2000000000;
  wide.hidden = 65536;
  wide.n_heads = 512;
  wide.n_kv_heads = 512;
  ModelConfig deep = testing::tiny_gqa_config();
  deep.n_layers = 2000000000;
  for (const ModelConfig& cfg : {wide, deep}) {
    const SafetensorsReader file = metadata_only_file(cfg);
    const ModelConfig claimed = config_from_metadata(file);
    try {
      load_model<float>(file, claimed);
      ADD_FAILURE() << "loaded an empty file as " << claimed.to_string();
    } catch (const SafetensorsError& e) {
      EXPECT_THAT(e.what(), HasSubstr("missing tensor 'model.embed_tokens.weight'"));
    }
  }
}

TEST(SafetensorsModel, LoadModelAndConfigErrorsNameTheFile) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  const auto path = std::filesystem::temp_directory_path() /
                    ("tspemu_ref_names_file_" + std::to_string(::getpid()) + ".safetensors");
  save_model(path.string(), init_weights<float>(cfg, 3));
  ModelConfig other = cfg;
  other.ffn = 32;
  try {
    load_model<float>(path.string(), other);
    ADD_FAILURE();
  } catch (const SafetensorsError& e) {
    EXPECT_THAT(e.what(), HasSubstr("disagrees with the config's"));
    EXPECT_THAT(e.what(), HasSubstr("file '" + path.string() + "'"));
  }
  ModelConfig bad = cfg;
  bad.norm_eps = 0;
  auto md = config_to_metadata(bad);
  SafetensorsWriter wr;
  for (const auto& [k, v] : md) wr.set_metadata(k, v);
  wr.save(path.string());
  try {
    config_from_metadata(SafetensorsReader::from_file(path.string()));
    ADD_FAILURE();
  } catch (const SafetensorsError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'norm_eps'='0'"));
    EXPECT_THAT(e.what(), HasSubstr("file '" + path.string() + "'"));
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tspemu::ref
