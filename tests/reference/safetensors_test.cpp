// safetensors: round trips, half-precision conversion on load, and rejection of every
// malformation with a clear error (never a crash or an out-of-bounds read; run under ASan in CI).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
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

// A tied model's head is its embedding: a stored lm_head.weight that differs would be silently
// unused (issue 41), so it is refused by name; one equal to the embedding is the same tensor
// stored twice and loads.
TEST(Safetensors, TiedConfigRefusesAStoredHeadThatDiffersFromTheEmbedding) {
  const ModelConfig untied = testing::tiny_gqa_config();
  ModelConfig tied = untied;
  tied.tie_embeddings = true;
  auto w = init_weights<float>(untied, 1);
  expect_load_error(save_model_bytes(w), tied,
                    "unexpected tensor 'lm_head.weight': the config ties the head to "
                    "'model.embed_tokens.weight', and the stored head differs from it at element 0 "
                    "[0, 0]");
  w.lm_head = w.embed;
  w.lm_head.back() += 1.0f;
  expect_load_error(save_model_bytes(w), tied,
                    "differs from it at element " + std::to_string(w.embed.size() - 1) + " [" +
                        std::to_string(untied.vocab - 1) + ", " +
                        std::to_string(untied.hidden - 1) + "]");
  w.lm_head = w.embed;
  const auto loaded = load_model<float>(SafetensorsReader::from_bytes(save_model_bytes(w)), tied);
  EXPECT_TRUE(loaded.lm_head.empty());
  EXPECT_EQ(loaded.embed, w.embed);
}

// NaN or an infinity in any weight is refused naming the tensor, the first bad element (flat
// index and coordinates) and its value, unless allowed; an F64 value past float's range becomes
// inf on conversion and is refused the same way.
TEST(Safetensors, NonFiniteWeightsAreRefusedNamingTensorAndElementUnlessAllowed) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  const std::string name = "model.layers.1.self_attn.k_proj.weight";
  for (const double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL, 1e300}) {
    auto w = init_weights<double>(cfg, 1);
    std::vector<double>* t = nullptr;
    std::vector<std::int64_t> shape;
    for (const auto& p : parameters(w)) {
      if (p.name == name) t = p.data, shape = p.shape;
    }
    ASSERT_NE(t, nullptr);
    const std::size_t at = shape[1] + 2;  // row 1, column 2
    (*t)[at] = bad;
    (*t)[at + 1] = std::nan("");  // only the first is named
    const Bytes file = save_model_bytes(w);
    try {
      load_model<float>(SafetensorsReader::from_bytes(file), cfg);
      ADD_FAILURE() << "loaded a non-finite weight " << bad;
    } catch (const NonFiniteWeightError& e) {
      EXPECT_THAT(e.what(), HasSubstr("tensor '" + name + "': element " + std::to_string(at) +
                                      " [1, 2] of " + std::to_string(t->size()) + " is "));
      EXPECT_THAT(e.what(), HasSubstr(std::isnan(bad) ? "nan" : "inf"));
    }
    const auto loaded = load_model<float>(SafetensorsReader::from_bytes(file), cfg,
                                          LoadOptions{.allow_nonfinite = true});
    EXPECT_FALSE(std::isfinite(loaded.layers[1].wk[at]));
  }
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

// ---------------------------------------------------------------- hostile headers

// The message of the SafetensorsError that reading `file` throws ("" and a test failure if none).
std::string reader_error(const Bytes& file) {
  try {
    SafetensorsReader::from_bytes(file);
    ADD_FAILURE() << "accepted a hostile file";
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

// n opening brackets, a 1, n closing ones.
std::string nested(std::size_t n) {
  return std::string(n, '[') + "1" + std::string(n, ']');
}

TEST(Safetensors, RejectsHeaderNestedDeeperThanTheFormatWithoutOverflowingTheStack) {
  constexpr std::size_t kDeep = 100000;  // a 200 KB header
  for (const std::string& header :
       {R"({"a":{"dtype":"F32","shape":)" + nested(kDeep) + R"(,"data_offsets":[0,4]}})",
        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":)" + nested(kDeep) + "}}",
        R"({"__metadata__":{"k":)" + nested(kDeep) + "}}", nested(kDeep)}) {
    const std::string msg = reader_error(make_file(header, Bytes(4)));
    EXPECT_THAT(msg, HasSubstr("nests deeper than 3 levels"));
    EXPECT_LT(msg.size(), 300u) << msg.substr(0, 300);
  }
  EXPECT_THAT(reader_error(make_file(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})",
                                     Bytes(4))),
              HasSubstr("tensor 'a': header nests deeper than 3 levels"));
}

bool has_control_character(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return (unsigned char)c < 0x20; });
}

TEST(Safetensors, ErrorMessagesQuoteAShortSanitizedPrefixOfHostileValues) {
  const std::string long_string(100000, 'x');
  const std::string name = "evil\n\x1b[2J" + long_string;
  for (const std::string& header :
       {R"({"a":{"dtype":"F32","shape":[")" + long_string + R"("],"data_offsets":[0,4]}})",
        R"({"a":{"dtype":")" + long_string + R"(","shape":[1],"data_offsets":[0,4]}})",
        R"({"evil\n\u001b[2J)" + long_string +
            R"(":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})",
        R"({"__metadata__":{")" + long_string + R"(":1}})"}) {
    const std::string msg = reader_error(make_file(header, Bytes(4)));
    EXPECT_LT(msg.size(), 400u) << msg.substr(0, 400);
    EXPECT_FALSE(has_control_character(msg)) << msg.substr(0, 400);
    EXPECT_THAT(msg, HasSubstr("xxxxxxxx"));  // the start of the value is still quoted
  }
  EXPECT_THAT(reader_error(make_file(R"({"evil\n\u001b[2J":{"dtype":"F31","shape":[1],)"
                                     R"("data_offsets":[0,4]}})",
                                     Bytes(4))),
              HasSubstr(R"(tensor 'evil\x0a\x1b[2J': unknown dtype 'F31')"));
}

TEST(Safetensors, RejectsDuplicateKeysInTheHeader) {
  const std::string a = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::string b = R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})";
  EXPECT_THAT(reader_error(make_file(R"({"a":)" + a + R"(,"a":)" + b + "}", Bytes(8))),
              HasSubstr("duplicate key 'a'"));
  EXPECT_THAT(
      reader_error(make_file(
          R"({"a":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})", Bytes(8))),
      HasSubstr("tensor 'a': duplicate key 'dtype'"));
  EXPECT_THAT(reader_error(make_file(R"({"__metadata__":{"k":"1"},"__metadata__":{"k":"2"}})")),
              HasSubstr("duplicate key '__metadata__'"));
  EXPECT_THAT(reader_error(make_file(R"({"__metadata__":{"k":"1","k":"2"}})")),
              HasSubstr("duplicate key 'k'"));
  // A tensor entry under the reserved name is not metadata.
  EXPECT_THAT(reader_error(make_file(R"({"__metadata__":)" + a + "}", Bytes(4))),
              HasSubstr("__metadata__['data_offsets'] is not a string"));
}

// The SafetensorsError message of f() ("" and a test failure if it does not throw one).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
    ADD_FAILURE() << "no SafetensorsError";
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, WriterRejectsDuplicateAndReservedTensorNames) {
  const std::vector<float> v(2, 1.0f);
  SafetensorsWriter wr;
  wr.add("a", std::span<const float>(v), {2});
  EXPECT_THAT(error_of([&] { wr.add("a", std::span<const float>(v), {2}); }),
              HasSubstr("tensor 'a' is already in the file"));
  EXPECT_THAT(error_of([&] { wr.add("__metadata__", std::span<const float>(v), {2}); }),
              HasSubstr("'__metadata__' is reserved"));
  // What was accepted still reads back: one tensor, no hole.
  const auto back = SafetensorsReader::from_bytes(wr.to_bytes());
  EXPECT_EQ(back.tensors().size(), 1u);
  EXPECT_EQ(back.read<float>("a"), v);
}

TEST(Safetensors, WriterAppliesTheReadersShapeRules) {
  const std::vector<float> one(1, 1.0f), none;
  SafetensorsWriter wr;
  // (-1)·(-1) and 2^32·2^32 wrap to the element counts 1 and 0 in size_t arithmetic.
  EXPECT_THAT(error_of([&] {
                wr.add("neg", std::span<const float>(one), {-1, -1});
              }),
              HasSubstr("tensor 'neg': shape [-1, -1] has a negative dimension"));
  EXPECT_THAT(error_of([&] {
                wr.add("big", std::span<const float>(none), {4294967296, 4294967296});
              }),
              HasSubstr("tensor 'big': shape [4294967296, 4294967296] overflows the byte count"));
  EXPECT_THAT(error_of([&] { wr.add("bad\xff", std::span<const float>(one), {1}); }),
              HasSubstr("is not valid UTF-8"));
  EXPECT_THAT(error_of([&] { wr.set_metadata("k", "\xc3"); }), HasSubstr("is not valid UTF-8"));
  wr.add("empty", std::span<const float>(none), {0, 4294967296});
  wr.add("ok", std::span<const float>(one), {1, 1});
  const auto back = SafetensorsReader::from_bytes(wr.to_bytes());
  EXPECT_EQ(back.info("empty").shape, (std::vector<std::int64_t>{0, 4294967296}));
  EXPECT_EQ(back.read<float>("ok"), one);
}

// ---------------------------------------------------------------- save

SafetensorsWriter small_writer() {
  static const std::vector<float> v = {1.0f, 2.0f, 3.0f};
  SafetensorsWriter wr;
  wr.add("a", std::span<const float>(v), {3});
  return wr;
}

Bytes file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A fresh empty directory under the temporary directory (named per process: other checkouts may
// run these tests at the same time), removed with its contents at the end.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path))
      out.push_back(e.path().filename());
    return out;
  }
};

TEST(Safetensors, SaveToAFullDeviceThrowsNamingThePath) {
  const std::string msg = error_of([] { small_writer().save("/dev/full"); });
  EXPECT_THAT(msg, HasSubstr("'/dev/full'"));
  EXPECT_THAT(msg, HasSubstr("No space left on device"));
}

TEST(Safetensors, SaveReplacesTheFileAndLeavesNoTemporary) {
  const ScratchDir dir("tspemu_save_replaces");
  const auto path = dir.path / "m.safetensors";
  std::ofstream(path) << "old contents";
  small_writer().save(path.string());
  EXPECT_EQ(file_bytes(path), small_writer().to_bytes());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.safetensors"});
  const std::string missing = (dir.path / "no_such_dir" / "m.safetensors").string();
  EXPECT_THAT(error_of([&] { small_writer().save(missing); }), HasSubstr("'" + missing + "'"));
  EXPECT_THAT(error_of([&] { small_writer().save(dir.path.string()); }),
              HasSubstr("is a directory"));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.safetensors"});
}

// Lowers the file-size limit so that writes past `bytes` fail (EFBIG, SIGXFSZ ignored), as a
// full disk would; restores both on destruction.
struct FileSizeLimit {
  rlimit old{};
  void (*old_handler)(int);
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old);
    old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old;
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
  }
};

TEST(Safetensors, FailedSaveLeavesTheOldFileIntactAndNoTemporary) {
  const ScratchDir dir("tspemu_save_fails");
  const auto path = dir.path / "m.safetensors";
  const std::vector<float> big(4096, 1.0f);
  SafetensorsWriter wr;
  wr.add("big", std::span<const float>(big), {4096});
  small_writer().save(path.string());
  const Bytes old = file_bytes(path);
  std::string msg;
  {
    const FileSizeLimit limit(1024);
    msg = error_of([&] { wr.save(path.string()); });
  }
  EXPECT_THAT(msg, HasSubstr("'" + path.string() + "'"));
  EXPECT_EQ(file_bytes(path), old);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.safetensors"});
}

TEST(Safetensors, RejectsADirectoryWithItsPath) {
  const ScratchDir dir("tspemu_read_dir");
  const std::string msg = error_of([&] { SafetensorsReader::from_file(dir.path.string()); });
  EXPECT_THAT(msg, HasSubstr("cannot read '" + dir.path.string() + "': it is a directory"));
}

TEST(Safetensors, RejectsAFifoAndADeviceNamingThemWithoutBlockingOrAllocating) {
  const ScratchDir dir("tspemu_read_fifo");
  const std::string fifo = (dir.path / "model.safetensors").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No writer ever opens the FIFO: a blocking open or read would hang this test.
  EXPECT_THAT(error_of([&] { SafetensorsReader::from_file(fifo); }),
              HasSubstr("cannot read '" + fifo + "': not a regular file (a FIFO)"));
  // /dev/zero never ends: read to its end it exhausts memory.
  EXPECT_THAT(error_of([] { SafetensorsReader::from_file("/dev/zero"); }),
              HasSubstr("cannot read '/dev/zero': not a regular file (a character device)"));
  const std::string link = (dir.path / "zero.safetensors").string();
  std::filesystem::create_symlink("/dev/zero", link);
  EXPECT_THAT(error_of([&] { SafetensorsReader::from_file(link); }),
              HasSubstr("cannot read '" + link + "': not a regular file (a character device)"));
}

// A header of n one-float tensors "t0", "t1", ... at consecutive offsets; the last one's name is
// `last` when given.
std::string many_tensors_header(std::size_t n, const std::string& last = "") {
  std::string h = "{";
  for (std::size_t i = 0; i < n; ++i) {
    const std::string name = i + 1 == n && !last.empty() ? last : "t" + std::to_string(i);
    h += (i ? ",\"" : "\"") + name + R"(":{"dtype":"F32","shape":[1],"data_offsets":[)" +
         std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  }
  return h + "}";
}

// The header check is one pass that keeps a key set per open object: every entry of a large
// header is read, and a refusal that only its last entry triggers is still found and named.
TEST(Safetensors, AHeaderOfManyTensorsIsReadWholeAndItsLastEntryChecked) {
  constexpr std::size_t kTensors = 50000;
  const Bytes data(4 * kTensors);
  const SafetensorsReader r =
      SafetensorsReader::from_bytes(make_file(many_tensors_header(kTensors), data));
  ASSERT_EQ(r.tensors().size(), kTensors);
  for (const std::size_t i : {std::size_t{0}, kTensors / 2, kTensors - 1}) {
    const TensorInfo& ti = r.info("t" + std::to_string(i));
    EXPECT_EQ(ti.begin, 4 * i);
    EXPECT_EQ(ti.end, 4 * i + 4);
    EXPECT_EQ(ti.shape, std::vector<std::int64_t>{1});
  }
  EXPECT_THAT(reader_error(make_file(many_tensors_header(kTensors, "t0"), data)),
              HasSubstr("duplicate key 't0'"));
  std::string deep = many_tensors_header(kTensors);
  deep.replace(deep.rfind("[1]"), 3, "[[1]]");
  EXPECT_THAT(reader_error(make_file(deep, data)),
              HasSubstr("tensor 't" + std::to_string(kTensors - 1) +
                        "': header nests deeper than 3 levels"));
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
