// `tspemu compare --inference` (compare_inference.hpp): the default run passes with a row for
// every registered decode strategy, in the table's order, each with the same keys; a strategy the
// shape does not suit is a skipped row with its reason; bad options exit 2 naming the flag and
// write nothing.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_outcome.hpp"
#include "cli_test_support.hpp"
#include "decode_session.hpp"

namespace tspemu::app {
namespace {

namespace fs = std::filesystem;
using namespace testing;  // cli_outcome.hpp, cli_test_support.hpp

std::vector<std::string> table_names() {
  std::vector<std::string> names;
  for (const DecodeStrategy& s : decode_strategies()) names.push_back(s.name);
  return names;
}

TEST(CompareInference, TheDefaultPassesWithARowForEveryDecodeStrategy) {
  const std::string json = temp_path("inference.json");
  fs::remove(json);
  const Outcome o = tspemu({"compare", "--inference", "-q", "--json", json});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  expect_blas_line(o.out);
  EXPECT_NE(o.out.find("verdict: PASS"), std::string::npos) << o.out;
  const nlohmann::json j = read_json(json);
  expect_document(j, "compare");
  EXPECT_EQ(j.at("config").at("inference"), true);
  EXPECT_EQ(j.at("config").at("ranks"), 4);
  EXPECT_EQ(j.at("config").at("prompt_lengths"), (std::vector<int>{7, 13, 5}));
  EXPECT_EQ(j.at("pass"), true);
  std::vector<std::string> names;
  for (const auto& r : j.at("rows")) names.push_back(r.at("strategy"));
  EXPECT_EQ(names, table_names());
  int ran = 0;
  for (const auto& r : j.at("rows")) {
    const std::string name = r.at("strategy");
    EXPECT_EQ(r.at("ranks"), name == "reference" ? 1 : 4) << name;
    EXPECT_NE(o.out.find("\n" + name + " "), std::string::npos) << name << "\n" << o.out;
    if (r.at("skipped").is_string()) continue;
    ++ran;
    for (const char* k : {"ttft_seconds", "tpot_seconds", "tokens_per_s", "max_err_ratio"})
      EXPECT_TRUE(r.at(k).is_number()) << name << " " << k;
    EXPECT_EQ(r.at("kv_cache").at("measured_bytes_per_rank").size(), r.at("ranks"));
    EXPECT_EQ(r.at("kv_cache").at("match"), true) << name;
    EXPECT_EQ(r.at("kv_cache").at("measured_bytes_max"), r.at("kv_cache").at("model_bytes_max"));
    EXPECT_TRUE(r.at("tokens_equal_reference").is_boolean()) << name;
    EXPECT_EQ(r.at("checked"), true) << name;
    EXPECT_EQ(r.at("verdict"), "pass") << name;
  }
  EXPECT_EQ(ran, static_cast<int>(table_names().size()));  // the default shape suits every one
  // Every parallel strategy states its decode steps' traffic: every collective kind it calls,
  // measured on every rank, equals its closed form (==), and the verdict says so.
  for (const auto& r : j.at("rows")) {
    const std::string name = r.at("strategy");
    if (name == "reference") continue;
    EXPECT_EQ(r.at("decode_traffic_match"), true) << name;
    EXPECT_EQ(r.at("tokens_equal_reference"), true) << name;
    const auto& kinds = r.at("decode_traffic_per_step");
    double received = 0;
    for (const auto& [kind, k] : kinds.items()) {
      received += k.at("measured_bytes_received_max").get<double>();
      EXPECT_EQ(k.at("measured_bytes_received_max"), k.at("model_bytes_received_max"))
          << name << " " << kind;
      EXPECT_EQ(k.at("match"), true) << name << " " << kind;
    }
    EXPECT_GT(received, 0) << name;
  }
  // TSP-W's steps call all three kinds.
  const auto& rows = j.at("rows");
  const auto tspw_at = std::find_if(
      rows.begin(), rows.end(), [](const nlohmann::json& r) { return r["strategy"] == "tsp-w"; });
  ASSERT_NE(tspw_at, rows.end());
  for (const char* kind : {"all_gather", "all_reduce", "all_to_all"})
    EXPECT_TRUE(tspw_at->at("decode_traffic_per_step").contains(kind)) << kind;
  EXPECT_EQ(j.at("rows").at(0).at("decode_traffic_per_step"), nlohmann::json::object());
}

// Two KV heads cannot be split over 4 TSP-W ranks: its row is skipped with tsp-w's reason, the
// reference still runs, and the comparison passes.
TEST(CompareInference, ARefusedStrategyIsASkippedRowWithItsReason) {
  const std::string json = temp_path("skipped.json");
  const Outcome o = tspemu({"compare", "--inference", "-q", "--kv-heads", "2", "-N", "4",
                            "--prompt-lengths", "5,9", "--json", json});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  const std::string reason = "--ranks 4: TSP-W decode: D=4 does not divide NKV=2";
  EXPECT_NE(o.out.find("skipped: " + reason), std::string::npos) << o.out;
  const nlohmann::json j = read_json(json);
  for (const auto& r : j.at("rows")) {
    if (r.at("strategy") == "tsp-w") {
      ASSERT_TRUE(r.at("skipped").is_string());
      EXPECT_NE(r.at("skipped").get<std::string>().find(reason), std::string::npos);
      EXPECT_EQ(r.at("verdict"), "skipped");
    }
    if (r.at("strategy") == "reference") {
      EXPECT_EQ(r.at("verdict"), "pass");
    }
  }
}

TEST(CompareInference, BadOptionsExitTwoNamingTheFlagAndWriteNothing) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--inference", "--new-tokens", "0"}, "--new-tokens 0: must be >= 1"},
      {{"--inference", "--prompt-lengths", "7,0"},
       "--prompt-lengths 7,0: sequence 1 has an empty prompt"},
      {{"--inference", "--max-context", "16", "--prompt-lengths", "4,17"},
       "the prompt of sequence 1 has 17 tokens, longer than the model's context of 16"},
      {{"--inference", "--ranks", "0"}, "--ranks 0: must be >= 1"},
      {{"--inference", "--sampling", "seeded", "--temperature", "0"},
       "--temperature 0: must be > 0"},
      {{"--inference", "--temperature", "2"}, "--temperature needs --sampling seeded"},
      {{"--inference", "--prompt", "hi", "--vocab", "100"},
       "--prompt hi: byte 0 is token 104, outside the vocabulary of 100"},
      {{"--inference", "--batch", "2"}, "--batch belongs to the training comparison"},
      {{"--inference", "--layers-only"}, "--layers-only belongs to the training comparison"},
      {{"--inference", "--sim-clock", "network"}, "--sim-clock belongs to the training comparison"},
      {{"--new-tokens", "4"}, "--new-tokens needs --inference"},
      {{"--prompt-lengths", "4,5"}, "--prompt-lengths needs --inference"},
  };
  const std::string json = temp_path("bad.json");
  for (const Case& c : cases) {
    fs::remove(json);
    std::vector<std::string> args = {"compare", "-q", "--json", json};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const Outcome o = tspemu(args);
    EXPECT_EQ(o.code, 2) << c.message << "\n" << o.out << o.err;
    EXPECT_NE(o.err.find(c.message), std::string::npos) << c.message << "\n" << o.err;
    EXPECT_FALSE(fs::exists(json)) << c.message;
  }
}

}  // namespace
}  // namespace tspemu::app
