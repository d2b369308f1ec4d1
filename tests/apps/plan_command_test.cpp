// `tspemu plan` (plan_command.hpp): the sweep's tables, JSON and SVG; the paper model's ordering
// and the strategy table's traffic formula; the dry run against the closed forms; the parsing of
// sizes, counts and sweeps, and their bounds.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_outcome.hpp"
#include "cli_test_support.hpp"
#include "plan_command.hpp"
#include "problem_options.hpp"
#include "tspemu/plan/strategy_table.hpp"

namespace tspemu::app {
namespace {

using namespace testing;  // cli_outcome.hpp, cli_test_support.hpp

TEST(Cli, PlanSweepWritesTablesJsonAndAWellFormedSvg) {
  const std::string json = temp_path("plan.json"), svg = temp_path("plan.svg");
  const Outcome o = tspemu({"plan", "paper-7b", "--sweep", "seq=16K..64K", "--device-mem", "80GB",
                            "--svg", svg, "--json", json});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  const nlohmann::json j = read_json(json);
  expect_document(j, "plan");
  EXPECT_EQ(j.at("config").at("device_bytes"), 80e9);
  ASSERT_EQ(j.at("tables").size(), 3u);
  EXPECT_EQ(j.at("tables")[2].at("S"), 65536);
  for (const auto& t : j.at("tables")) {
    EXPECT_NEAR(t.at("tsp_over_tp_forward").get<double>(), t.at("paper_ratio").get<double>(),
                1e-12);
    for (const auto& r : t.at("rows")) {
      if (r.at("skipped").is_string()) continue;
      EXPECT_TRUE(r.at("memory_bytes").at("total").is_number());
      EXPECT_TRUE(r.at("fits").is_boolean());
      EXPECT_TRUE(r.at("forward_bytes_per_layer").is_number());
    }
  }
  const std::string doc = read_file(svg);
  std::string why;
  EXPECT_TRUE(well_formed(doc, "svg", &why)) << why;
  EXPECT_GE(std::count(doc.begin(), doc.end(), '\n'), 10);
  EXPECT_NE(doc.find("<polyline"), std::string::npos);
  EXPECT_NE(doc.find("device 80.00 GB"), std::string::npos);  // the capacity line
  EXPECT_NE(doc.find("TSP D=8"), std::string::npos);          // a legend entry
  std::remove(json.c_str());
  std::remove(svg.c_str());
}

TEST(Cli, PlanOfThePaperModelAt128KOrdersTspBelowTp) {
  const std::string json = temp_path("plan.json");
  const Outcome o = tspemu({"plan", "paper-7b", "--seq", "128K", "--json", json});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("1/2 + 4h/(B·S) = 0.6250"), std::string::npos) << o.out;
  const auto rows = read_json(json).at("tables")[0].at("rows");
  EXPECT_LT(rows[0].at("memory_bytes").at("total").get<double>(),
            rows[1].at("memory_bytes").at("total").get<double>());
  std::remove(json.c_str());
}

// plan's forward bytes per layer per device are the strategy table's traffic formula (elements)
// times bf16's 2 bytes, for every strategy it lists, at the paper's model from 16K to 128K.
TEST(Cli, PlanPrintsTheStrategyTablesTrafficFormula) {
  const std::string json = temp_path("plan.json"), svg = temp_path("plan.svg");
  const Outcome o =
      tspemu({"plan", "paper-7b", "--sweep", "seq=16K..128K", "--svg", svg, "--json", json});
  ASSERT_EQ(o.code, 0) << o.err;
  const nlohmann::json j = read_json(json);
  ASSERT_EQ(j.at("tables").size(), 4u);
  int checked = 0;
  for (const auto& table : j.at("tables")) {
    const tsp::cost::ModelShape m = tsp::cost::paper_7b(1, table.at("S").get<std::int64_t>());
    for (const auto& row : table.at("rows")) {
      ASSERT_TRUE(row.at("skipped").is_null()) << row.dump();
      const std::string name = row.at("strategy");
      bool found = false;
      for (const tsp::cost::Strategy& st : tsp::strategies_at(8)) {
        if (st.name() != name) continue;
        found = true;
        const double elements = tsp::strategy_info(st.scheme).paper_forward_elements(m, st);
        EXPECT_DOUBLE_EQ(row.at("forward_bytes_per_layer").get<double>(), elements * 2)
            << name << " S=" << m.S;
        ++checked;
      }
      EXPECT_TRUE(found) << name << " is not a strategy of the table at 8 ranks";
    }
  }
  EXPECT_EQ(checked, 4 * 6);  // TSP, TP, Megatron-SP, SP, TP+SP 2x4 and 4x2 at each length
  std::remove(json.c_str());
  std::remove(svg.c_str());
}

TEST(Cli, PlanDryRunRunsEveryStrategysBlocksAtTheRealSizeAndMatchesTheClosedForms) {
  const std::string json = temp_path("plan.json");
  const Outcome o =
      tspemu({"plan", "paper-7b", "--seq", "128K", "--devices", "8", "--dry-run", "--json", json});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("process max RSS"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("DIFFER"), std::string::npos) << o.out;
  const auto rows = read_json(json).at("tables")[0].at("dry_run");
  ASSERT_EQ(rows.size(), 8u);  // TSP, TP, Megatron-SP, SP, Ulysses, ring, TP+SP 2x4 and 4x2
  for (const auto& r : rows) {
    SCOPED_TRACE(r.at("strategy").get<std::string>());
    ASSERT_TRUE(r.at("skipped").is_null());
    EXPECT_EQ(r.at("traffic_equals_closed_form"), true);
    // Gigabytes per rank, measured in no memory.
    EXPECT_GT(r.at("peak_bytes").get<double>(), 1e9);
    EXPECT_LT(r.at("seconds").get<double>(), 10.0);
  }
  std::remove(json.c_str());
}

TEST(Cli, SizesAndSweepsParse) {
  EXPECT_EQ(parse_count("--seq", "128K"), 131072);
  EXPECT_EQ(parse_count("--seq", "4096"), 4096);
  EXPECT_DOUBLE_EQ(parse_bytes("--device-mem", "80GB"), 80e9);
  EXPECT_DOUBLE_EQ(parse_bytes("--device-mem", "96GiB"), 96.0 * (1ull << 30));
  EXPECT_EQ(parse_sweep("seq=16K..128K"), (std::vector<std::int64_t>{16384, 32768, 65536, 131072}));
  EXPECT_EQ(parse_sweep("seq=16K..64K:4"), (std::vector<std::int64_t>{16384, 32768, 49152, 65536}));
  EXPECT_EQ(parse_sweep("seq=1K,3K"), (std::vector<std::int64_t>{1024, 3072}));
}

// plan --sweep seq=16K..128K:2147483648 segfaulted (steps cast to int), seq=1..9e18 looped forever
// once the doubling overflowed, and --seq 1e300 / 9e18 overflowed into wrong figures.
TEST(Cli, CountsAndSweepsOutsideTheirBoundsAreRefusedNamingTheLimit) {
  auto refused = [](auto&& parse, const std::string& needle) {
    try {
      parse();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted; expected an error containing " << needle;
  };
  refused([] { parse_sweep("seq=16K..128K:2147483648"); }, "at most 256 points");
  refused([] { parse_sweep("seq=1..9e18"); }, "between 1 and 1099511627776");
  refused([] { parse_count("--seq", "1e300"); }, "between 1 and");
  refused([] { parse_count("--seq", "0"); }, "must be positive");
  refused([] { parse_count("--seq", "-4K"); }, "must be positive");
  std::string many = "seq=1";
  for (int i = 2; i <= 257; ++i) many += "," + std::to_string(i);
  refused([&] { parse_sweep(many); }, "at most 256 points");
  // The largest doubling sweep ends at the bound, in 41 points.
  const auto widest = parse_sweep("seq=1..1099511627776");
  ASSERT_EQ(widest.size(), 41u);
  EXPECT_EQ(widest.back(), kMaxCount);
  EXPECT_EQ(parse_sweep("seq=1K..64K:256").size(), 256u);
}

}  // namespace
}  // namespace tspemu::app
