// safetensors: round trips, half-precision conversion on load, and rejection of every
// malformation with a clear error (never a crash or an out-of-bounds read; run under ASan in CI).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::ref {
namespace {

using ::testing::HasSubstr;
using Bytes = std::vector<unsigned char>;

// A file from a literal header and data buffer, header length as given (default: its size).
Bytes make_file(const std::string& header, const Bytes& data = {}, std::uint64_t len = ~0ull) {
  if (len == ~0ull) len = header.size();
  Bytes out(8 + header.size() + data.size());
  std::memcpy(out.data(), &len, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

void expect_reader_error(const Bytes& file, const std::string& message) {
  try {
    SafetensorsReader::from_bytes(file);
    ADD_FAILURE() << "accepted a file that should fail with: " << message;
  } catch (const SafetensorsError& e) {
    EXPECT_THAT(e.what(), HasSubstr(message));
  }
}

void expect_load_error(const Bytes& file, const ModelConfig& cfg, const std::string& message) {
  try {
    load_model<float>(SafetensorsReader::from_bytes(file), cfg);
    ADD_FAILURE() << "loaded a file that should fail with: " << message;
  } catch (const SafetensorsError& e) {
    EXPECT_THAT(e.what(), HasSubstr(message));
  }
}

// A model file for cfg with one tensor's entry replaced (or dropped, or one added).
Bytes model_file_with(const ModelConfig& cfg, const std::string& edit_name,
                      const std::string& dtype = "F32", std::vector<std::int64_t> shape = {},
                      bool drop = false, const std::string& extra = "") {
  const auto w = init_weights<float>(cfg, 1);
  SafetensorsWriter wr;
  for (const auto& p : parameters(w)) {
    if (p.name != edit_name) {
      wr.add(p.name, std::span<const float>(*p.data), p.shape);
      continue;
    }
    if (drop) continue;
    std::size_t n = 1;
    for (auto d : shape) n *= std::size_t(d);
    if (dtype == "F32") {
      std::vector<float> v(n, 1.0f);
      wr.add(p.name, std::span<const float>(v), shape);
    } else {
      std::vector<std::int64_t> v(n, 1);
      wr.add(p.name, std::span<const std::int64_t>(v), shape);
    }
  }
  if (!extra.empty()) {
    std::vector<float> v(3, 0.0f);
    wr.add(extra, std::span<const float>(v), {3});
  }
  return wr.to_bytes();
}

TEST(Safetensors, ModelRoundTripsBitwiseInF32AndF64WithConfigInMetadata) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  const auto wf = init_weights<float>(cfg, 11);
  const auto wd = init_weights<double>(cfg, 11);
  const auto path = std::filesystem::temp_directory_path() / "tspemu_ref_roundtrip.safetensors";
  save_model(path.string(), wf);
  const auto rf = load_model<float>(path.string(), cfg);
  EXPECT_EQ(rf.layers[1].wv, wf.layers[1].wv);
  EXPECT_EQ(rf.lm_head, wf.lm_head);
  save_model(path.string(), wd);
  const auto file = SafetensorsReader::from_file(path.string());
  EXPECT_EQ(file.info("model.layers.0.self_attn.k_proj.weight").dtype, "F64");
  const auto rd = load_model<double>(file, cfg);
  EXPECT_EQ(rd.embed, wd.embed);
  EXPECT_EQ(rd.layers[0].w_down, wd.layers[0].w_down);
  const ModelConfig back = config_from_metadata(file.metadata());
  EXPECT_EQ(back.to_string(), cfg.to_string());
  std::filesystem::remove(path);
}

TEST(Safetensors, HalfPrecisionConversionsAreExact) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc049), -3.140625f);
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(f16_to_float(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_EQ(std::signbit(f16_to_float(0x8000)), true);
}

TEST(Safetensors, Bf16AndF16TensorsAreConvertedOnLoad) {
  const Bytes data = {0x80, 0x3f, 0x49, 0xc0, 0x00, 0x3c, 0x00, 0xc0};  // little-endian
  const auto file = SafetensorsReader::from_bytes(
      make_file(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
                data));
  EXPECT_EQ(file.read<float>("a"), (std::vector<float>{1.0f, -3.140625f}));
  EXPECT_EQ(file.read<double>("b"), (std::vector<double>{1.0, -2.0}));
}

TEST(Safetensors, RejectsFileShorterThanTheLengthField) {
  expect_reader_error(Bytes{1, 2, 3}, "shorter than the 8-byte header length");
}

TEST(Safetensors, RejectsHeaderLengthPastTheEnd) {
  expect_reader_error(make_file("{}", {}, 3), "runs past the end of the file");
  expect_reader_error(make_file("{}", {}, ~0ull - 1), "runs past the end of the file");
}

TEST(Safetensors, RejectsBadJson) {
  expect_reader_error(make_file(R"({"a": {"dtype": "F32",)"), "not valid JSON");
  expect_reader_error(make_file("[1, 2]"), "not an object");
  expect_reader_error(make_file(R"({"__metadata__": {"k": 1}})"), "is not a string");
}

TEST(Safetensors, RejectsMalformedEntries) {
  expect_reader_error(make_file(R"({"a": 5})"), "tensor 'a': entry is not an object");
  expect_reader_error(make_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", Bytes(4)),
                      "tensor 'a': missing or non-string dtype");
  expect_reader_error(make_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", Bytes(4)),
                      "tensor 'a': missing or non-array shape");
  expect_reader_error(
      make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", Bytes(4)),
      "data_offsets must be an array of two integers");
  expect_reader_error(
      make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", Bytes(4)),
      "shape entry -1 is not a non-negative integer");
  expect_reader_error(
      make_file(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", Bytes(4)),
      "shape entry 1.5 is not a non-negative integer");
  expect_reader_error(
      make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,4]}})", Bytes(4)),
      "data_offsets entry -4");
}

TEST(Safetensors, RejectsUnknownDtype) {
  expect_reader_error(
      make_file(R"({"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", Bytes(4)),
      "tensor 'a': unknown dtype 'F31'");
}

TEST(Safetensors, RejectsOffsetsOutOfRange) {
  expect_reader_error(
      make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", Bytes(8)),
      "has begin > end");
  expect_reader_error(
      make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", Bytes(4)),
      "data_offsets end 8 is past the data buffer of 4 bytes");
  expect_reader_error(
      make_file(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}})",
          Bytes(4)),
      "past the data buffer");
}

TEST(Safetensors, RejectsByteSizeThatDisagreesWithShape) {
  expect_reader_error(
      make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", Bytes(8)), "needs 12");
  expect_reader_error(
      make_file(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                Bytes(8)),
      "overflows the byte count");
}

TEST(Safetensors, RejectsOverlappingTensors) {
  expect_reader_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                Bytes(12)),
                      "overlap");
}

TEST(Safetensors, AcceptsEmptyTensorsAndHoles) {
  const auto f = SafetensorsReader::from_bytes(
      make_file(R"({"a":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                Bytes(8)));
  EXPECT_TRUE(f.read<float>("a").empty());
  EXPECT_EQ(f.read<float>("b").size(), 1u);
}

TEST(Safetensors, RejectsWrongDtypeForAWeight) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  expect_load_error(model_file_with(cfg, "model.norm.weight", "I64", {cfg.hidden}), cfg,
                    "tensor 'model.norm.weight': wrong dtype I64");
}

TEST(Safetensors, RejectsShapeThatDisagreesWithConfig) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  expect_load_error(model_file_with(cfg, "model.layers.1.self_attn.k_proj.weight", "F32",
                                    {cfg.q_dim(), cfg.hidden}),
                    cfg,
                    "tensor 'model.layers.1.self_attn.k_proj.weight': shape [16, 16] disagrees "
                    "with the config's [8, 16]");
}

TEST(Safetensors, RejectsMissingTensor) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  expect_load_error(model_file_with(cfg, "model.layers.0.mlp.up_proj.weight", "F32", {}, true), cfg,
                    "missing tensor 'model.layers.0.mlp.up_proj.weight'");
  expect_load_error(model_file_with(cfg, "lm_head.weight", "F32", {}, true), cfg,
                    "missing tensor 'lm_head.weight'");
}

TEST(Safetensors, RejectsUnexpectedTensorButToleratesRotaryBuffers) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  expect_load_error(model_file_with(cfg, "", "F32", {}, false, "model.layers.2.mlp.up_proj.weight"),
                    cfg, "unexpected tensor 'model.layers.2.mlp.up_proj.weight'");
  EXPECT_NO_THROW(load_model<float>(
      SafetensorsReader::from_bytes(model_file_with(
          cfg, "", "F32", {}, false, "model.layers.0.self_attn.rotary_emb.inv_freq")),
      cfg));
}

TEST(Safetensors, TiedConfigIgnoresAStoredHeadOfTheEmbeddingShape) {
  const ModelConfig untied = testing::tiny_gqa_config();
  ModelConfig tied = untied;
  tied.tie_embeddings = true;
  const auto w = init_weights<float>(untied, 1);
  const auto loaded = load_model<float>(SafetensorsReader::from_bytes(save_model_bytes(w)), tied);
  EXPECT_TRUE(loaded.lm_head.empty());
  EXPECT_EQ(loaded.embed, w.embed);
}

TEST(Safetensors, ConfigMetadataMissingOrUnparsableFieldIsNamed) {
  auto md = config_to_metadata(testing::tiny_gqa_config());
  md.erase("n_kv_heads");
  EXPECT_THAT([&] { config_from_metadata(md); },
              ::testing::ThrowsMessage<SafetensorsError>(HasSubstr("'n_kv_heads'")));
  md = config_to_metadata(testing::tiny_gqa_config());
  md["ffn"] = "many";
  EXPECT_THAT([&] { config_from_metadata(md); },
              ::testing::ThrowsMessage<SafetensorsError>(HasSubstr("'ffn'='many'")));
}

TEST(Safetensors, RejectsUnreadableFileWithItsPath) {
  try {
    SafetensorsReader::from_file("/nonexistent/x.safetensors");
    ADD_FAILURE();
  } catch (const SafetensorsError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/x.safetensors"));
  }
}

// Random truncations and bit flips of a valid checkpoint: each must load or throw
// SafetensorsError, nothing else (and, under ASan, never read out of bounds).
TEST(Safetensors, FuzzedTruncationsAndBitFlipsThrowCleanlyOrLoad) {
  ModelConfig cfg = testing::tiny_gqa_config();
  cfg.n_layers = 1;
  const Bytes good = save_model_bytes(init_weights<float>(cfg, 2));
  std::uint64_t header_len;
  std::memcpy(&header_len, good.data(), 8);
  SplitMix64 rng(99);
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    Bytes f = good;
    const int mode = iter % 3;
    if (mode == 0) {
      f.resize(rng.next() % f.size());
    } else {
      // Flip 1-4 bits, mostly in the length field and header where parsing happens.
      const int flips = 1 + int(rng.next() % 4);
      for (int k = 0; k < flips; ++k) {
        const std::size_t limit = mode == 1 ? 8 + header_len : f.size();
        const std::size_t at = rng.next() % limit;
        f[at] ^= static_cast<unsigned char>(1u << (rng.next() % 8));
      }
    }
    try {
      const auto m = load_model<float>(SafetensorsReader::from_bytes(std::move(f)), cfg);
      ++loaded;
    } catch (const SafetensorsError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 500);
  EXPECT_GT(loaded, 10);  // flips in the data buffer load fine
}

}  // namespace
}  // namespace tspemu::ref
