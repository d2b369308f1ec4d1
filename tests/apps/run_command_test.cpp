// `tspemu run` (run_command.hpp): the default run passes and writes its JSON report; every
// strategy passes as the whole model and as the layer stack; the Chrome trace, the simulated clock
// and the injection seed; TSP's overlap of communication on the simulated clock. Configurations
// are tiny so the suite stays fast under AddressSanitizer.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "cli_outcome.hpp"
#include "cli_test_support.hpp"

namespace tspemu::app {
namespace {

using namespace testing;  // cli_outcome.hpp, cli_test_support.hpp

TEST(Cli, RunDefaultPassesAndWritesTheReportAsJson) {
  const std::string json = temp_path("run.json");
  const Outcome o = tspemu({"run", "-q", "--json", json});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("verdict: PASS"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("whole model"), std::string::npos);
  EXPECT_NE(o.out.find("matches the cost model exactly"), std::string::npos);
  expect_blas_line(o.out);
  const nlohmann::json j = read_json(json);
  expect_document(j, "run");
  EXPECT_EQ(j.at("config").at("strategy"), "TSP D=4");
  EXPECT_EQ(j.at("config").at("S"), 2048);
  EXPECT_TRUE(j.at("time").at("seconds").is_number());
  EXPECT_TRUE(j.at("time").at("tokens_per_s").is_number());
  ASSERT_EQ(j.at("memory").size(), 4u);
  EXPECT_TRUE(j.at("memory")[0].at("peak_bytes").is_number_unsigned());
  EXPECT_TRUE(j.at("memory")[0].at("category_peak_bytes").at("weights").is_number());
  ASSERT_EQ(j.at("traffic").size(), 4u);
  EXPECT_EQ(j.at("traffic")[0].at("match"), true);
  const auto& bc = j.at("traffic")[0].at("forward").at("broadcast");
  EXPECT_EQ(bc.at("bytes_received"), bc.at("model_bytes_received"));
  EXPECT_EQ(j.at("traffic_match"), true);
  EXPECT_EQ(j.at("memory_model").at("match"), true);
  EXPECT_TRUE(j.at("memory_model").at("weights_bytes").is_number_unsigned());
  EXPECT_GT(j.at("accuracy").size(), 10u);
  EXPECT_TRUE(j.at("accuracy")[0].at("ok").is_boolean());
  EXPECT_TRUE(j.at("max_err_ratio").is_number());
  EXPECT_EQ(j.at("verdict"), "pass");
  std::remove(json.c_str());
}

// Every strategy's run, as the whole model (the default) and as the layer stack.
void expect_every_strategy_passes(bool layers_only) {
  const std::vector<std::vector<std::string>> cases = {
      {"--strategy", "tsp", "--ranks", "2"},
      {"--strategy", "tp", "--ranks", "2"},
      {"--strategy", "megatron-sp", "--ranks", "2"},
      {"--strategy", "sp", "--ranks", "2"},
      {"--strategy", "tp-sp", "--tp", "2", "--sp", "2"},
      {"--strategy", "ulysses", "--ranks", "2"},
      {"--strategy", "ring", "--ranks", "4"}};
  for (const auto& c : cases) {
    std::vector<std::string> args = {"run"};
    args.insert(args.end(), c.begin(), c.end());
    if (layers_only) args.emplace_back("--layers-only");
    const Outcome o = tspemu(tiny(args));
    EXPECT_EQ(o.code, 0) << c[1] << "\n" << o.out << o.err;
    EXPECT_NE(o.out.find(layers_only ? "ran: layer stack" : "ran: whole model"), std::string::npos)
        << c[1] << "\n"
        << o.out;
    EXPECT_NE(o.out.find("verdict: PASS"), std::string::npos) << c[1];
    EXPECT_NE(o.out.find("equal on every rank"), std::string::npos) << c[1] << "\n" << o.out;
  }
}

TEST(Cli, RunEveryStrategysWholeModelPasses) {
  expect_every_strategy_passes(false);
}

TEST(Cli, RunEveryStrategyOnTheLayerStackPasses) {
  expect_every_strategy_passes(true);
}

TEST(Cli, RunWritesAChromeTraceAndReportsTheSimulatedClockAndTheInjectionSeed) {
  const std::string trace = temp_path("trace.json"), json = temp_path("report.json");
  const Outcome o =
      // TSP: its MLP circulates weight shards by send/recv, so the trace has flow arrows.
      tspemu(tiny({"run", "--trace", trace, "--sim-clock", "nvlink", "--inject-seed", "9", "--json",
                   json}));
  ASSERT_EQ(o.code, 0) << o.err << o.out;
  EXPECT_NE(o.out.find("trace: "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("simulated step: "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("estimate from a cost model, not a measurement (model nvlink"),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("rerun with --inject-seed 9"), std::string::npos) << o.out;
  const nlohmann::json t = read_json(trace);
  ASSERT_TRUE(t.contains("traceEvents")) << "Chrome trace JSON object format";
  std::set<int> pids;
  int flows_out = 0, flows_in = 0, counters = 0;
  for (const auto& e : t["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    const std::string ph = e["ph"];
    flows_out += ph == "s";
    flows_in += ph == "f";
    counters += ph == "C";
  }
  EXPECT_GE(pids.size(), 4u) << "a track per rank";
  EXPECT_GT(flows_out, 0);
  EXPECT_EQ(flows_out, flows_in) << "every send's arrow ends at its receive";
  EXPECT_GT(counters, 0) << "arena bytes";
  const nlohmann::json r = read_json(json);
  EXPECT_GT(r["simulated"]["seconds"].get<double>(), 0);
  EXPECT_EQ(r["injection"]["seed"].get<int>(), 9);
  EXPECT_EQ(r["trace"]["path"].get<std::string>(), trace);
  EXPECT_GT(r["trace"]["events"].get<int>(), 0);
  std::filesystem::remove(trace);
  std::filesystem::remove(json);
}

// TSP's attention posts its weight broadcasts and K/V all-gathers ahead (TspOptions::overlap): on
// the simulated clock some communication runs under compute, exposing less than the serial
// schedule; --serial-attention keeps every collective exposed. A transfer's overlapped time is the
// compute that ran during it (sim_streams.hpp), so the tiny model is charged at 1 GFLOP/s (--peak
// 0.001): at the preset's 1307 TFLOP/s its spans round to 0 ns and nothing could overlap.
TEST(Cli, TspRunOverlapsCommunicationOnTheSimulatedClockUnlessSerial) {
  const std::string json = temp_path("overlap.json");
  double overlapped[2] = {0, 0}, exposed[2] = {0, 0};
  for (bool serial : {false, true}) {
    std::vector<std::string> args = {"run",    "--no-check", "--sim-clock", "mi300x-if",
                                     "--peak", "0.001",      "--json",      json};
    if (serial) args.emplace_back("--serial-attention");
    const Outcome o = tspemu(tiny(args));
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    const nlohmann::json j = read_json(json);
    for (const auto& t : j["simulated"]["per_rank"]) {
      overlapped[serial] += t["overlapped_comm_seconds"].get<double>();
      exposed[serial] += t["exposed_comm_seconds"].get<double>();
      EXPECT_LE(t["overlapped_comm_seconds"].get<double>(), t["compute_seconds"].get<double>());
    }
  }
  EXPECT_GT(overlapped[0], 0);
  EXPECT_EQ(overlapped[1], 0);
  EXPECT_LT(exposed[0], exposed[1]);
  std::filesystem::remove(json);
}

}  // namespace
}  // namespace tspemu::app
