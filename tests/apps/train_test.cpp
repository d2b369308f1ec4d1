// `tspemu train` (train_run.hpp, train_command.hpp): every strategy trains a few steps within the
// rule with its model-state bytes as planned; the JSON and the SVG; the run stops at the first
// step that breaks the rule, naming the tensor; bad corpora are refused before anything runs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_outcome.hpp"
#include "corpus.hpp"
#include "train_run.hpp"
#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/blas_kernel.hpp"

namespace tspemu::app {
namespace {

using testing::Outcome;
using testing::temp_path;
using testing::tspemu;

// A tiny model every strategy accepts on 4 ranks, with a byte-level vocabulary.
std::vector<std::string> tiny(std::vector<std::string> args) {
  for (const char* a : {"--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "4",
                        "--ffn", "64", "--vocab", "256", "--seq", "32", "--steps", "3", "-q"})
    args.emplace_back(a);
  return args;
}

TEST(Train, EveryStrategyTrainsWithinTheRuleWithModelStateBytesAsPlanned) {
  const std::vector<std::vector<std::string>> cases = {
      {"--strategy", "tsp"},
      {"--strategy", "tp"},
      {"--strategy", "megatron-sp"},
      {"--strategy", "sp"},
      {"--strategy", "ulysses"},
      {"--strategy", "ring"},
      {"--strategy", "tp-sp", "--tp", "2", "--sp", "2"},
      {"--strategy", "tp", "--layers-only"}};
  for (const auto& optimizer : {"adamw", "sgd"})
    for (auto args : cases) {
      args.insert(args.begin(), "train");
      args.insert(args.end(), {"--optimizer", optimizer});
      const Outcome o = tspemu(tiny(args));
      EXPECT_EQ(o.code, 0) << args[2] << " " << optimizer << "\n" << o.out << o.err;
      EXPECT_NE(o.out.find("verdict: PASS"), std::string::npos) << o.out;
      EXPECT_EQ(o.out.find("differs"), std::string::npos) << o.out;
    }
}

TEST(Train, WritesJsonWithEveryStepAndAWellFormedSvg) {
  const std::string json = temp_path("train.json"), svg = temp_path("train.svg");
  const Outcome o = tspemu(tiny({"train", "--json", json, "--svg", svg}));
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("command"), "train");
  EXPECT_EQ(j.at("blas"), ref::describe_blas());
  EXPECT_NE(o.out.find("\nblas: " + ref::describe_blas() + "\n"), std::string::npos) << o.out;
  EXPECT_EQ(j.at("bf16_gemm"), ref::describe_bf16_gemm());
  EXPECT_NE(o.out.find("\nbf16 gemm: " + ref::describe_bf16_gemm() + "\n"), std::string::npos)
      << o.out;
  ASSERT_EQ(j.at("steps").size(), 3u);
  EXPECT_EQ(j.at("steps")[2].at("step"), 3);
  EXPECT_TRUE(j.at("steps")[0].at("loss").is_number());
  EXPECT_LT(j.at("steps")[0].at("err_ratio").get<double>(), 1.0);
  EXPECT_EQ(j.at("memory_match"), true);
  EXPECT_EQ(j.at("planned_per_rank").at("optimizer"),
            2 * j.at("planned_per_rank").at("weights").get<std::uint64_t>());
  EXPECT_EQ(j.at("measured_per_rank").size(), 4u);
  EXPECT_EQ(j.at("pass"), true);
  std::ifstream s(svg);
  std::stringstream text;
  text << s.rdbuf();
  EXPECT_NE(text.str().find("<svg"), std::string::npos);
  EXPECT_NE(text.str().find("</svg>"), std::string::npos);
  EXPECT_NE(text.str().find("reference fp32"), std::string::npos);
  std::remove(json.c_str());
  std::remove(svg.c_str());
}

TEST(Train, StopsAtTheFirstStepThatBreaksTheRuleNamingTheTensor) {
  // Rank 1's MLP shard of layer 0 moved by 1e-3 after the second update, as a misplaced update
  // would: the run stops at step 2 naming the tensor.
  TrainConfig c;
  c.stack.model = {
      .vocab = 256, .hidden = 32, .n_layers = 1, .n_heads = 4, .n_kv_heads = 4, .ffn = 64};
  c.stack.S = 32;
  c.stack.strategy = tsp::cost::Strategy::tsp(4);
  c.steps = 5;
  c.corpus = builtin_corpus(1024);
  c.corpus_name = "built-in";
  c.after_update = [](int step, int rank, std::span<const tsp::ParameterShard> shards) {
    if (step != 2 || rank != 1) return;
    for (const tsp::ParameterShard& p : shards)
      if (std::string(p.name) == "mlp")
        for (float& w : p.weight) w += 1e-3f;
  };
  const TrainResult r = run_training(c);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.steps.size(), 2u) << "the run stops at the failing step";
  EXPECT_EQ(r.failure.rfind("step 2: model.layers.0.mlp.", 0), 0u) << r.failure;
  EXPECT_NE(r.failure.find("breaks the rule"), std::string::npos) << r.failure;
}

TEST(Train, BadCorporaAreRefusedNamingTheFileAndThePlace) {
  const std::string text = temp_path("bad.txt"), tokens = temp_path("bad.tokens");
  std::ofstream(text) << "ok\xff";
  Outcome o = tspemu(tiny({"train", "--data", text}));
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("not UTF-8 at byte 2 (0xFF)"), std::string::npos) << o.err;
  std::ofstream(tokens) << "1 2 x3";
  o = tspemu(tiny({"train", "--data", tokens}));
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("token 2 is 'x3'"), std::string::npos) << o.err;
  {
    std::ofstream f(tokens);
    for (int i = 0; i < 40; ++i) f << (i == 7 ? 999 : i) << " ";
  }
  o = tspemu(tiny({"train", "--data", tokens}));
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("token 7 is 999, outside [0, vocab=256)"), std::string::npos) << o.err;
  {
    std::ofstream f(tokens);
    for (int i = 0; i < 10; ++i) f << i << "\n";
  }
  o = tspemu(tiny({"train", "--data", tokens}));
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("10 tokens, fewer than S + 1 = 33"), std::string::npos) << o.err;
  o = tspemu(tiny({"train", "--data", "/nonexistent/corpus.txt"}));
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("cannot open"), std::string::npos) << o.err;
  std::vector<std::string> zero_steps = tiny({"train"});
  zero_steps.insert(zero_steps.end(), {"--steps", "0"});  // the last one wins
  o = tspemu(zero_steps);
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("--steps 0"), std::string::npos) << o.err;
  std::remove(text.c_str());
  std::remove(tokens.c_str());
}

TEST(Train, TextCorpusIsItsBytes) {
  EXPECT_EQ(byte_tokens("a\xc3\xa9", "x"), (std::vector<std::int32_t>{'a', 0xc3, 0xa9}));
  const auto c = builtin_corpus(256);
  EXPECT_EQ(c.size(), 256u);
  EXPECT_EQ(c, builtin_corpus(256)) << "deterministic";
}

}  // namespace
}  // namespace tspemu::app
