// `tspemu plan --inference` (plan_inference.hpp) through the command's entry point: the report's
// figures are the decode cost model's (INFERENCE-NOTES §1.5 at the paper's 7B-class model), the
// JSON document's keys and types, and bad options refused with the flag named, exit 2, nothing
// written.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_outcome.hpp"
#include "cli_test_support.hpp"
#include "tspemu/plan/decode_cost.hpp"

namespace tspemu::app {
namespace {

using testing::Outcome;
using testing::read_json;
using testing::temp_path;
using testing::tspemu;
namespace cost = tsp::cost;

const nlohmann::json& schedule(const nlohmann::json& doc, const std::string& name) {
  for (const nlohmann::json& s : doc.at("schedules"))
    if (s.at("schedule") == name) return s;
  ADD_FAILURE() << "no schedule " << name;
  return doc;
}

TEST(PlanInference, ThePaperModelsDecodeFiguresAreTheNotes) {
  const std::string json = temp_path("plan.json");
  const Outcome o = tspemu({"plan", "paper-7b", "--inference", "--json", json});
  ASSERT_EQ(o.code, 0) << o.err;
  const nlohmann::json doc = read_json(json);
  EXPECT_EQ(doc.at("command"), "plan");
  EXPECT_EQ(doc.at("config").at("inference"), true);
  EXPECT_EQ(doc.at("config").at("element_bytes"), 2);
  // The layers' decode bytes per step (LSE and vocabulary apart), §1.5.
  EXPECT_EQ(schedule(doc, "SP Σ=8").at("comm_bytes_per_step"), 458752.0);
  EXPECT_EQ(schedule(doc, "TP+SP T=2×Σ=4").at("comm_bytes_per_step"), 720896.0);
  EXPECT_EQ(schedule(doc, "TP T=8").at("comm_bytes_per_step"), 917504.0);
  EXPECT_EQ(schedule(doc, "TSP-W D=8").at("comm_bytes_per_step"), 1433600.0);
  EXPECT_EQ(schedule(doc, "TSP-M D=8").at("comm_bytes_per_step"), 15032844288.0);
  EXPECT_EQ(schedule(doc, "TSP-W D=8").at("collectives_per_layer"), 5);
  // 8 GiB of KV per rank at 128K, every schedule (MHA).
  for (const nlohmann::json& s : doc.at("schedules")) {
    ASSERT_TRUE(s.at("skipped").is_null()) << s.at("schedule");
    EXPECT_EQ(s.at("kv_bytes"), std::uint64_t{8} << 30) << s.at("schedule");
    EXPECT_TRUE(s.at("collectives").is_array());
  }
  // Weights with the preset's vocabulary (32000 × 4096, untied, + final norm) split over 8:
  // the notes' 2 148 007 936 B of layers plus 65 544 192 B.
  EXPECT_EQ(schedule(doc, "TSP-W D=8").at("weight_bytes"), 2148007936u + 65544192u);
  // The max context is the library's for the preset and 80 GB.
  cost::ModelShape m = cost::paper_7b(1, 131072);
  EXPECT_EQ(schedule(doc, "TSP-W D=8").at("max_context"),
            cost::decode_max_context(m, cost::DecodeStrategy::tsp_w(8), 80000000000, 2));
  const nlohmann::json& c = schedule(doc, "TSP-W D=8").at("collectives")[0];
  EXPECT_EQ(c.at("what"), "Q all-gather");
  EXPECT_EQ(c.at("collective"), "all_gather");
  EXPECT_EQ(c.at("payload_bytes"), 8192);
  // The text table has a row per schedule and the collectives in detail.
  EXPECT_NE(o.out.find("TSP-W D=8"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("K/V route to owners"), std::string::npos) << o.out;
  std::remove(json.c_str());
}

TEST(PlanInference, SchedulesTheShapeDoesNotSuitAreSkippedWithTheReason) {
  const Outcome o = tspemu({"plan", "paper-7b", "--inference", "--devices", "3"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("TP T=3: T=3 must divide n_heads=32"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("SP Σ=3 "), std::string::npos) << o.out;  // SP runs any degree
}

TEST(PlanInference, BadOptionsAreRefusedNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"plan", "--inference", "--element-bytes", "3"}, "--element-bytes 3: must be 1, 2 or 4"},
      {{"plan", "--inference", "--sweep", "seq=1K..2K"},
       "--sweep seq=1K..2K: not with --inference"},
      {{"plan", "--inference", "--dry-run"}, "--dry-run: not with --inference"},
      {{"plan", "--inference", "--devices", "0"}, "--devices 0"},
      {{"plan", "--inference", "--device-mem", "80"}, "--device-mem 80: give a unit"},
      {{"plan", "--inference", "--seq", "0"}, "--seq 0"},
      {{"plan", "--inference", "--batch", "0"}, "--batch 0"},
      {{"plan", "--inference", "--kv-heads", "5"}, "--kv-heads 5: must divide --heads 32"},
  };
  for (const Case& c : cases) {
    const Outcome o = tspemu(c.args);
    EXPECT_EQ(o.code, 2) << c.message << "\n" << o.err;
    EXPECT_NE(o.err.find(c.message), std::string::npos) << o.err;
    EXPECT_EQ(o.out, "");
  }
}

}  // namespace
}  // namespace tspemu::app
