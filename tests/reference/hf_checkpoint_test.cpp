// Hugging Face Llama checkpoint directories: single-file and sharded round trips bit for bit,
// half-precision shards converted exactly, and every malformed directory refused before the model
// is allocated, naming the file and the tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "tspemu/reference/hf_checkpoint.hpp"
#include "tspemu/reference/hf_llama_config.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::ref {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;

class HfCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "hf_ckpt_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& f) const { return dir_ + "/" + f; }
  static ModelWeights<float> model(bool tied = false) {
    return convert_weights<float>(
        init_weights<double>(tied ? testing::tiny_tied_config() : testing::tiny_gqa_config(), 7));
  }
  // The message load_hf_checkpoint<float> throws ("" and a failure if it loads).
  std::string load_error() const {
    try {
      (void)load_hf_checkpoint<float>(dir_);
      ADD_FAILURE() << "loaded";
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }
  Json index() const { return Json::parse(std::ifstream(path("model.safetensors.index.json"))); }
  void write_index(const Json& j) const {
    std::ofstream(path("model.safetensors.index.json")) << j.dump();
  }
  std::string dir_;
};

template <class T>
void expect_bitwise_equal(const ModelWeights<T>& a, const ModelWeights<T>& b) {
  EXPECT_EQ(a.config.to_string(), b.config.to_string());
  const auto pa = parameters(a), pb = parameters(b);
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].name, pb[i].name);
    ASSERT_EQ(pa[i].data->size(), pb[i].data->size()) << pa[i].name;
    EXPECT_EQ(std::memcmp(pa[i].data->data(), pb[i].data->data(), pa[i].data->size() * sizeof(T)),
              0)
        << pa[i].name;
  }
}

TEST_F(HfCheckpoint, SingleFileRoundTripsBitwiseInFloatAndDouble) {
  for (const bool tied : {false, true}) {
    const auto w = model(tied);
    const auto files = save_hf_checkpoint(dir_, w);
    EXPECT_EQ(files, (std::vector<std::string>{path("model.safetensors"), path("config.json")}));
    expect_bitwise_equal(load_hf_checkpoint<float>(dir_), w);
    const auto w64 = init_weights<double>(w.config, 9);
    save_hf_checkpoint(dir_, w64);
    expect_bitwise_equal(load_hf_checkpoint<double>(dir_), w64);
    const auto st = SafetensorsReader::from_file(path("model.safetensors"));
    EXPECT_EQ(st.metadata().at("format"), "pt");
    EXPECT_EQ(st.info("model.layers.1.self_attn.k_proj.weight").shape,
              (std::vector<std::int64_t>{w.config.kv_dim(), 16}));  // Linear [out, in]
    EXPECT_EQ(st.contains("lm_head.weight"), !tied);
  }
}

TEST_F(HfCheckpoint, ShardedRoundTripsBitwiseWithAnIndexOfEveryTensor) {
  const auto w = model();
  // embed [13, 16] floats = 832 bytes; each layer's 9 tensors 4,800 bytes.
  const auto files = save_hf_checkpoint(dir_, w, 2000);
  ASSERT_GT(files.size(), 4u);
  char first[64];
  std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", files.size() - 2);
  EXPECT_EQ(files[0], path(first));
  EXPECT_FALSE(fs::exists(path("model.safetensors")));
  const Json j = index();
  std::uint64_t total = 0;
  for (const auto& p : parameters(w)) {
    ASSERT_TRUE(j["weight_map"].contains(p.name)) << p.name;
    const auto shard = SafetensorsReader::from_file(path(j["weight_map"][p.name]));
    EXPECT_TRUE(shard.contains(p.name));
    total += p.data->size() * sizeof(float);
  }
  EXPECT_EQ(j["metadata"]["total_size"], total);
  for (const std::string& f : files) {  // no shard above the limit unless one tensor is
    if (f.ends_with(".safetensors")) {
      const auto shard = SafetensorsReader::from_file(f);
      std::uint64_t bytes = 0;
      for (const auto& [name, info] : shard.tensors()) bytes += info.end - info.begin;
      EXPECT_TRUE(bytes <= 2000 || shard.tensors().size() == 1) << f << ": " << bytes;
    }
  }
  expect_bitwise_equal(load_hf_checkpoint<float>(dir_), w);
}

TEST_F(HfCheckpoint, SavingAgainRemovesTheWeightFilesOfAnEarlierSave) {
  const auto w = model();
  save_hf_checkpoint(dir_, w, 2000);
  std::ofstream(path("tokenizer.json")) << "{}";  // not ours: kept
  save_hf_checkpoint(dir_, w);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_)) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  expect_bitwise_equal(load_hf_checkpoint<float>(dir_), w);
}

// F16 bits of k / 1024 for |k| < 1024: 0, or a normal number m * 2^-10 = 1.f * 2^(e - 10).
std::uint16_t f16_of_k_over_1024(int k) {
  if (k == 0) return 0;
  const std::uint16_t sign = k < 0 ? 0x8000 : 0;
  const unsigned m = unsigned(k < 0 ? -k : k);
  const int e = std::bit_width(m) - 1;
  return std::uint16_t(sign | unsigned(e - 10 + 15) << 10 | ((m << (10 - e)) & 0x3ffu));
}

// Writes a safetensors file by hand with every tensor of w as BF16 (top 16 bits, rounding
// toward zero) or F16 (values chosen exactly representable), as transformers saves bf16 models.
TEST_F(HfCheckpoint, HalfPrecisionShardsAreConvertedExactly) {
  auto w = model();
  for (const char* dtype : {"BF16", "F16"}) {
    Json header = {{"__metadata__", {{"format", "pt"}}}};
    std::string data;
    ModelWeights<float> expect = w;
    for (auto& p : parameters(expect)) {
      for (float& x : *p.data) {
        std::uint16_t h;
        if (std::string(dtype) == "BF16") {
          std::uint32_t u;
          std::memcpy(&u, &x, 4);
          h = std::uint16_t(u >> 16);
          x = bf16_to_float(h);
        } else {  // k/1024 for |k| < 1024: exact in F16 as 0x6400 + k with the sign bit
          const int k = int(x * 256);
          x = float(k) / 1024.0f;
          h = f16_of_k_over_1024(k);
        }
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
      header[p.name] = {{"dtype", dtype},
                        {"shape", p.shape},
                        {"data_offsets", {data.size() - 2 * p.data->size(), data.size()}}};
    }
    fs::create_directories(dir_);
    std::string h = header.dump();
    const std::uint64_t n = h.size();
    std::ofstream out(path("model.safetensors"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << h << data;
    out.close();
    std::ofstream(path("config.json")) << llama_config_to_json(w.config);
    expect_bitwise_equal(load_hf_checkpoint<float>(dir_), expect);
  }
}

TEST_F(HfCheckpoint, MissingOrMisshapedTensorsAreNamedWithTheirFile) {
  auto w = model();
  save_hf_checkpoint(dir_, w, 2000);
  Json j = index();
  // A tensor the index does not list: the index is the file named.
  j["weight_map"].erase("model.layers.1.mlp.up_proj.weight");
  write_index(j);
  EXPECT_THAT(load_error(), HasSubstr("missing tensor 'model.layers.1.mlp.up_proj.weight' (file '" +
                                      path("model.safetensors.index.json") + "')"));
  // ... and in a shard the index reads for other tensors: a stray, refused as such.
  j = index();
  const std::string shard = j["weight_map"]["model.layers.1.input_layernorm.weight"];
  ASSERT_EQ(shard, j["weight_map"]["model.layers.0.mlp.down_proj.weight"]);  // shared
  j["weight_map"].erase("model.layers.1.input_layernorm.weight");
  write_index(j);
  EXPECT_THAT(load_error(), HasSubstr("shard '" + path(shard) +
                                      "' holds tensor 'model.layers.1.input_layernorm.weight', "
                                      "which the index does not list"));
  fs::remove_all(dir_);
  auto bad = model();
  save_hf_checkpoint(dir_, bad, 2000);
  j = index();
  // The index maps a tensor to a shard that lacks it.
  const std::string other = j["weight_map"]["model.norm.weight"];
  j["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = other;
  write_index(j);
  EXPECT_THAT(load_error(), HasSubstr("maps tensor 'model.layers.0.self_attn.q_proj.weight' to '" +
                                      other + "', which does not hold it"));
  // A wrong shape: written under a config with a wider MLP, read under the narrower one.
  fs::remove_all(dir_);
  auto wide_cfg = bad.config;
  wide_cfg.ffn = 32;
  save_hf_checkpoint(dir_, convert_weights<float>(init_weights<double>(wide_cfg, 1)));
  std::ofstream(path("config.json")) << llama_config_to_json(bad.config);
  EXPECT_THAT(load_error(), HasSubstr("tensor 'model.layers.0.mlp.gate_proj.weight': shape [32, "
                                      "16] disagrees with the config's [24, 16]"));
  EXPECT_THAT(load_error(), HasSubstr("(file '" + path("model.safetensors") + "')"));
}

TEST_F(HfCheckpoint, AnIndexNamingAMissingOrOutsideShardIsRefused) {
  save_hf_checkpoint(dir_, model(), 2000);
  Json j = index();
  j["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
  write_index(j);
  EXPECT_THAT(load_error(), HasSubstr("cannot open '" + path("model-00009-of-00009.safetensors")));
  j["weight_map"]["model.norm.weight"] = "../model.safetensors";
  write_index(j);
  EXPECT_THAT(load_error(), HasSubstr("weight_map['model.norm.weight']='../model.safetensors' is "
                                      "not a plain file name"));
  write_index(Json{{"weight_map", Json::object()}});
  EXPECT_THAT(load_error(), HasSubstr("'weight_map' is empty"));
  write_index(Json{{"weight_map", {{"a", 1}}}});
  EXPECT_THAT(load_error(), HasSubstr("weight_map['a'] is not a string"));
  std::ofstream(path("model.safetensors.index.json"))
      << R"({"weight_map": {"a": "x"}, "weight_map": {}})";
  EXPECT_THAT(load_error(), HasSubstr("duplicate key 'weight_map'"));
  write_index(Json{{"weight_map", {{"a", "x"}}}, {"extra", 1}});
  EXPECT_THAT(load_error(), HasSubstr("unknown key 'extra'"));
}

TEST_F(HfCheckpoint, DirectoryErrorsNameWhatIsMissingOrAmbiguous) {
  EXPECT_THAT(load_error(), HasSubstr("checkpoint directory '" + dir_ + "' does not exist"));
  save_hf_checkpoint(dir_, model());
  std::ofstream(path("model.safetensors.index.json")) << "{}";
  EXPECT_THAT(load_error(), HasSubstr("holds both model.safetensors and "
                                      "model.safetensors.index.json: ambiguous"));
  fs::remove(path("model.safetensors.index.json"));
  fs::remove(path("model.safetensors"));
  EXPECT_THAT(load_error(), HasSubstr("holds neither model.safetensors nor"));
  fs::remove(path("config.json"));
  EXPECT_THAT(load_error(),
              HasSubstr("config.json: cannot read '" + path("config.json") + "': no such file"));
}

// A config that claims a huge model over a tiny file fails on the file's first missing tensor,
// before anything of the claimed size is allocated.
TEST_F(HfCheckpoint, AHugeConfigOverATinyFileFailsBeforeAllocating) {
  save_hf_checkpoint(dir_, model());
  Json cfg = Json::parse(std::ifstream(path("config.json")));
  cfg["vocab_size"] = 1000000000;
  cfg["num_hidden_layers"] = 100000;
  std::ofstream(path("config.json")) << cfg.dump();
  EXPECT_THAT(load_error(), HasSubstr("tensor 'model.embed_tokens.weight': shape [13, 16] "
                                      "disagrees with the config's [1000000000, 16]"));
}

}  // namespace
}  // namespace tspemu::ref
