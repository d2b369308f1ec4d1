// `tspemu generate --strategy tsp-m` (apps/decode_strategies.cpp, tsp/tspm_decoder.hpp): the run
// passes its check with TSP-W's KV cache bytes per rank (the same layout), and a degree TSP-M
// cannot run exits 2 naming the flags, TSP-M and the values.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_outcome.hpp"

namespace tspemu::app {
namespace {

using testing::Outcome;
using testing::temp_path;
using testing::tspemu;

nlohmann::json run_json(const std::string& strategy) {
  const std::string json = temp_path("generate-" + strategy + ".json");
  const Outcome o =
      tspemu({"generate", "-q", "--strategy", strategy, "--ranks", "4", "--json", json});
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("verdict: PASS"), std::string::npos) << o.out;
  return nlohmann::json::parse(std::ifstream(json));
}

TEST(GenerateTspm, PassesWithTheKvCacheBytesOfTspw) {
  const nlohmann::json m = run_json("tsp-m"), w = run_json("tsp-w");
  EXPECT_EQ(m.at("verdict"), "pass");
  EXPECT_EQ(m.at("kv_cache").at("match"), true);
  EXPECT_EQ(m.at("kv_cache").at("measured_bytes_per_rank"),
            w.at("kv_cache").at("measured_bytes_per_rank"));
}

TEST(GenerateTspm, ADegreeItCannotRunExitsTwoNamingIt) {
  const Outcome o = tspemu({"generate", "-q", "--strategy", "tsp-m", "--ranks", "8"});
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("--strategy tsp-m --ranks 8: TSP-M decode: D=8 does not divide NKV=4"),
            std::string::npos)
      << o.err;
}

}  // namespace
}  // namespace tspemu::app
