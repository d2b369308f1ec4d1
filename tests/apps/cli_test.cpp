// The tspemu command through its library entry point (cli.hpp) with an argv: exit codes and the
// messages of bad configurations, the JSON documents of every subcommand (keys and types), the
// SVG charts (well-formed XML with an <svg> root), the default `run` passing. Configurations are
// tiny so the suite stays fast under AddressSanitizer.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_outcome.hpp"
#include "plan_command.hpp"
#include "problem_options.hpp"
#include "run_memory.hpp"
#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/reference/blas_kernel.hpp"

namespace tspemu::app {
namespace {

using testing::Outcome;
using testing::temp_path;
using testing::tspemu;

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return nlohmann::json::parse(f);
}

// Under mpirun with several processes, the commands that do not span processes refuse (exit 2,
// naming the process count) instead of running P independent copies, and so does a run whose
// ranks the processes do not divide, before any world is made; plan (no ranks) still works.
// (Spanning runs: tests/apps/mpi/cli_under_mpirun.sh under a real mpirun.)
TEST(Cli, CommandsThatCannotSpanMpirunProcessesRefuseInsteadOfRunningIndependentCopies) {
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"selfcheck"},
                                             {"train"},
                                             {"paper"},
                                             {"run", "--ranks", "3"},
                                             {"compare", "--ranks", "3"}}) {
    const Outcome o = tspemu(args);
    EXPECT_EQ(o.code, 2) << args[0];
    EXPECT_NE(o.err.find("launched by mpirun with 2 processes"), std::string::npos)
        << args[0] << ": " << o.err;
  }
  const Outcome plan = tspemu({"plan", "paper-7b", "--seq", "16K"});
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(plan.code, 0) << plan.err;
}

// A tiny model every strategy accepts on up to 4 ranks.
std::vector<std::string> tiny(std::vector<std::string> args) {
  for (const char* a : {"--layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "4",
                        "--ffn", "48", "--vocab", "64", "--seq", "32", "-q"})
    args.emplace_back(a);
  return args;
}

// Minimal XML well-formedness: every tag closed in order, one root element named `root`,
// attribute quotes balanced; the prolog and comments are skipped.
bool well_formed(const std::string& xml, const std::string& root, std::string* why) {
  std::vector<std::string> open;
  int roots = 0;
  std::size_t i = 0;
  while ((i = xml.find('<', i)) != std::string::npos) {
    const std::size_t end = xml.find('>', i);
    if (end == std::string::npos) return *why = "unterminated tag", false;
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return *why = "empty tag", false;
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) return *why = "quotes in <" + tag, false;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return *why = "unbalanced </" + name + ">", false;
      open.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (open.empty()) {
      ++roots;
      if (name != root) return *why = "root is <" + name + ">", false;
    }
    if (tag.back() != '/') open.push_back(name);
  }
  if (!open.empty()) return *why = "<" + open.back() + "> not closed", false;
  if (roots != 1) return *why = std::to_string(roots) + " root elements", false;
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Every document names the BLAS kernel its timings ran on, as the text report does.
void expect_document(const nlohmann::json& j, const char* command) {
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("command"), command);
  EXPECT_EQ(j.at("schema_version"), 1);
  EXPECT_EQ(j.at("blas"), ref::describe_blas());
  EXPECT_TRUE(j.at("config").is_object());
}

void expect_blas_line(const std::string& report) {
  const std::string line = "\nblas: " + ref::describe_blas() + "\n";
  EXPECT_NE(report.find(line), std::string::npos) << "no line <" << line << "> in\n" << report;
}

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

TEST(Cli, CompareHasOneRowPerStrategyWithTheSameKeysAndReasonsForSkips) {
  const std::string json = temp_path("compare.json");
  // 2 KV heads: TSP, TP, Megatron-SP and Ulysses at 4 ranks cannot shard them; SP, ring attention
  // and TP+SP 2x2 can.
  std::vector<std::string> args = tiny({"compare", "--ranks", "4", "--json", json});
  args.insert(args.end(), {"--kv-heads", "2"});
  const Outcome o = tspemu(args);
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  expect_blas_line(o.out);
  const nlohmann::json j = read_json(json);
  expect_document(j, "compare");
  EXPECT_EQ(j.at("config").at("whole_model"), true);
  const auto& rows = j.at("rows");
  ASSERT_EQ(rows.size(), 7u);  // TSP, TP, Megatron-SP, SP, Ulysses, ring, TP+SP 2x2
  std::vector<std::string> names;
  for (const auto& r : rows) names.push_back(r.at("strategy"));
  EXPECT_EQ(names,
            (std::vector<std::string>{"TSP D=4", "TP T=4", "TP+Megatron-SP T=4", "SP Sp=4",
                                      "Ulysses n=4", "Ring attention n=4", "TP+SP T=2×Σ=2"}));
  EXPECT_EQ(rows[5].at("verdict"), "pass");  // ring attention shards tokens, not heads
  int ran = 0;
  for (const auto& r : rows) {
    EXPECT_TRUE(r.at("strategy").is_string());
    EXPECT_EQ(r.at("ranks"), 4);
    if (r.at("skipped").is_string()) {
      EXPECT_NE(r.at("skipped").get<std::string>().find("--kv-heads 2"), std::string::npos);
      continue;
    }
    ++ran;
    for (const char* k : {"seconds", "tokens_per_s", "peak_bytes_per_rank",
                          "forward_bytes_per_rank", "backward_bytes_per_rank", "max_err_ratio"})
      EXPECT_TRUE(r.at(k).is_number()) << k;
    EXPECT_EQ(r.at("model_match"), true);
    EXPECT_EQ(r.at("verdict"), "pass");
  }
  EXPECT_EQ(ran, 3);
  EXPECT_NE(o.out.find("skipped: --kv-heads 2"), std::string::npos) << o.out;
  std::remove(json.c_str());
}

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

TEST(Cli, AnUnknownStrategyIsRejectedListingTheKnownOnes) {
  const Outcome o = tspemu({"run", "--strategy", "fsdp"});
  EXPECT_EQ(o.code, 2);
  for (const tsp::StrategyInfo& e : tsp::strategies())
    EXPECT_NE(o.err.find(e.name), std::string::npos) << e.name << " not listed in: " << o.err;
  ProblemOptions p;
  p.strategy = "fsdp";
  try {
    parse_strategy(p);
    FAIL() << "parse_strategy accepted fsdp";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--strategy fsdp: unknown strategy 'fsdp' (known: " +
                                         tsp::strategy_names() + ")"),
              std::string::npos)
        << e.what();
  }
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

TEST(Cli, ScaleWritesJsonAndAWellFormedSvg) {
  const std::string json = temp_path("scale.json"), svg = temp_path("scale.svg");
  const Outcome o = tspemu(tiny({"scale", "--max-ranks", "2", "--repeat", "1", "--mode", "both",
                                 "--json", json, "--svg", svg}));
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("efficiency = "), std::string::npos);
  expect_blas_line(o.out);
  const nlohmann::json j = read_json(json);
  expect_document(j, "scale");
  EXPECT_TRUE(j.at("cores").is_number_integer());
  ASSERT_EQ(j.at("rows").size(), 4u);  // strong and weak at D = 1, 2
  for (const auto& r : j.at("rows")) {
    EXPECT_TRUE(r.at("mode") == "strong" || r.at("mode") == "weak");
    EXPECT_TRUE(r.at("tokens_per_s").is_number());
    EXPECT_TRUE(r.at("efficiency").is_number());
    EXPECT_EQ(r.at("model_match"), true);
  }
  EXPECT_DOUBLE_EQ(j.at("rows")[0].at("efficiency").get<double>(), 1.0);
  std::string why;
  EXPECT_TRUE(well_formed(read_file(svg), "svg", &why)) << why;
  std::remove(json.c_str());
  std::remove(svg.c_str());
}

TEST(Cli, BadConfigurationsExitTwoNamingTheFlagAndTheConstraint) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"run", "--seq", "1004"}, "--seq 1004: S must be divisible by 2·D = 8"},
      {{"run", "--strategy", "tp", "--ranks", "3"}, "--heads 8: the query heads must be divisible"},
      {{"run", "--strategy", "tp-sp", "--tp", "2", "--sp", "3"}, "2·Sp = 6"},
      {{"run", "--strategy", "ulysses", "--ranks", "8"},
       "--kv-heads 4: the key/value heads must be divisible by the Ulysses degree n = 8 "
       "(--ranks 8"},
      {{"run", "--strategy", "ulysses", "--ranks", "4", "--heads", "6", "--kv-heads", "3",
        "--hidden", "192"},
       "--heads 6: the query heads must be divisible by the Ulysses degree n = 4 (--ranks 4"},
      {{"run", "--strategy", "ring", "--ranks", "3"}, "--seq 2048: S must be divisible by 2·n = 6"},
      {{"run", "--kv-heads", "3"}, "--kv-heads 3: must divide --heads 8"},
      {{"run", "--vocab", "1022"}, "--vocab 1022"},
      {{"run", "--strategy", "fsdp"}, "--strategy"},
      {{"run", "--no-such-flag"}, "--no-such-flag"},
      {{"compare", "--ranks", "0"}, "--ranks 0"},
      {{"plan", "--device-mem", "80"}, "--device-mem 80: give a unit"},
      {{"plan", "--seq", "12Q"}, "--seq 12Q"},
      {{"plan", "gpt-5"}, "preset gpt-5: unknown"},
      {{"plan", "--sweep", "len=1..2"}, "--sweep"},
      {{"plan", "--layers", "0"}, "--layers 0: must be >= 1"},
      {{"plan", "--vocab", "-3"}, "--vocab -3: must be >= 1"},
      {{"plan", "--batch", "0"}, "--batch 0: must be >= 1"},
      {{"plan", "--hidden", "4611686018427387904"},
       "--hidden 4611686018427387904: must be at most"},
      {{"plan", "--hidden", "1099511627776", "--heads", "1", "--kv-heads", "1"},
       "overflows 64-bit counts"},
      {{"plan", "--seq", "1024M", "--batch", "1048576"}, "--batch 1048576 x --seq 1073741824"},
      {{"scale", "--max-ranks", "0"}, "--max-ranks 0"},
      {{"run", "--config", "/nonexistent/tspemu.json"}, "--config /nonexistent/tspemu.json"},
      {{"run", "--sim-clock", "tpu"},
       "--sim-clock tpu: unknown model (nvlink, network, h100-nvlink or mi300x-if)"},
      {{"compare", "--sim-clock", "mi300x-if", "--nodes", "3"},
       "--nodes 3: must be >= 1 and divide the 4 ranks"},
      {{"run", "--sim-clock", "mi300x-if", "--mfu", "2"}, "--mfu 2: must be at most 1"},
      {{"run", "--mfu", "0.5"}, "--peak, --mfu, link and node flags need --sim-clock"},
      {{"run", "--inject-seed", "3", "--inject-probability", "2"},
       "--inject-probability 2: must be at most 1"},
      {{"run", "--inject-seed", "3", "--inject-delay-us", "-5"}, "--inject-delay-us -5"},
      {{"run", "--strategy", "tp-sp", "--tp", "64", "--sp", "64"},
       "--tp 64 --sp 64: the mesh has 4096 ranks; a world has 1 to 256"},
      {{"run", "--strategy", "tp-sp", "--tp", "65536", "--sp", "65536"},
       "--tp 65536: must be at most 256"},
      {{"run", "--ranks", "100000"}, "--ranks 100000: must be at most 256"},
      {{"run", "--seed", "-1"}, "-1: must be a non-negative integer"},
      {{"run", "--inject-seed", "-1"}, "-1: must be a non-negative integer"},
      {{"run", "--inject-seed", "3", "--inject-delay-us", "2147483647"},
       "--inject-delay-us 2147483647: must be in [0, 7500000], a quarter of the 30 s hang "
       "timeout"},
  };
  for (const Case& c : cases) {
    const Outcome o = tspemu(c.args);
    EXPECT_EQ(o.code, 2) << c.args[1];
    EXPECT_NE(o.err.find(c.message), std::string::npos)
        << "args: " << c.args[1] << "\nstderr: " << o.err;
  }
}

TEST(Cli, RunsThatCannotFitInMemoryAreRefusedBeforeAllocatingNamingGiBPerRankAndTotal) {
  // Each would grow to the machine's limit and die of std::bad_alloc if run.
  const std::vector<std::vector<std::string>> cases = {
      {"run", "--hidden", "65536", "--seq", "1048576", "-q"},
      {"run", "--layers", "100000", "-q"},
      {"run", "--strategy", "tp", "--layers", "100000", "--no-check", "-q"},
      {"compare", "--layers", "100000", "-q"},
      {"scale", "--layers", "100000", "--max-ranks", "2", "-q"},
  };
  for (const auto& args : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const Outcome o = tspemu(args);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(o.code, 2) << args[0] << " " << args[1] << "\n" << o.err;
    for (const char* part :
         {"invalid configuration: memory: ", " per rank (arena capacity 16.00 GiB)", " in total (",
          " available, MemAvailable in /proc/meminfo"})
      EXPECT_NE(o.err.find(part), std::string::npos) << part << "\n" << o.err;
    EXPECT_LT(took, 2.0) << "the check must be cheap: " << o.err;
  }
}

TEST(Cli, RunMemoryIsALowerBoundOfWhatTheRunAllocatesAndRefusesPastTheArenaCapacity) {
  ProblemOptions p;
  p.model.n_layers = 2;
  p.S = 256;
  for (const char* strategy : {"tsp", "tp", "sp"}) {
    p.strategy = strategy;
    StackConfig c = make_stack_config(p, parse_strategy(p));
    const RunMemory need = require_run_memory(c, false, strategy, UINT64_MAX, std::size_t{1} << 40);
    const StackResult r = run_stack(c);
    ASSERT_EQ(need.rank.size(), r.ranks.size());
    for (std::size_t i = 0; i < r.ranks.size(); ++i) {
      // The run's arena peak counts from after construction plus what was resident then.
      EXPECT_LE(need.rank[i], r.ranks[i].arena.peak) << strategy << " rank " << i;
      // ... and not a useless one: at least a quarter of it.
      EXPECT_GE(need.rank[i], r.ranks[i].arena.peak / 4) << strategy << " rank " << i;
    }
    EXPECT_GT(need.host, 0u);
    try {
      require_run_memory(c, false, strategy, UINT64_MAX, need.max_rank() - 1);
      ADD_FAILURE() << strategy << ": accepted a capacity below its need";
    } catch (const ConfigError& e) {
      // Refused by the stack's total or by the dry layer itself, both against the capacity.
      const std::string what = e.what();
      EXPECT_TRUE(what.find("a rank's arena exceeds its capacity") != std::string::npos ||
                  what.find("one layer alone does not fit in a rank's arena") != std::string::npos)
          << what;
    }
    EXPECT_THROW(require_run_memory(c, false, strategy, need.total() - 1, std::size_t{1} << 40),
                 ConfigError);
  }
}

TEST(Cli, ACommandThatWouldRunNothingIsRefused) {
  // compare at 3 ranks of the default model: every strategy's row is skipped; scale of an odd
  // sequence: every point is.
  const Outcome c = tspemu({"compare", "--ranks", "3", "-q"});
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_EQ(c.out, "") << "refused after starting";
  EXPECT_NE(c.err.find("--ranks 3: no strategy can run this configuration; TSP D=3: "),
            std::string::npos)
      << c.err;
  std::vector<std::string> odd = tiny({"scale", "--max-ranks", "2", "--mode", "strong"});
  odd.insert(odd.end(), {"--seq", "33"});
  const Outcome s = tspemu(odd);
  EXPECT_EQ(s.code, 2) << s.out;
  EXPECT_EQ(s.out, "") << "refused after starting";
  EXPECT_NE(s.err.find("--max-ranks 2: no point of the sweep can run this configuration; strong "
                       "D=1: "),
            std::string::npos)
      << s.err;
}

TEST(Cli, OutputsAreCheckedBeforeTheRunNamingTheFlagAndWrittenWholeOrNotAtAll) {
  const std::string dir = temp_path("out");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::string missing = dir + "/no/such/dir/r.json";
  const std::vector<Case> cases = {
      {{"run", "--json", missing}, "--json " + missing + ": cannot create a temporary file"},
      {{"run", "--trace", dir}, "--trace " + dir + ": cannot write"},
      {{"compare", "--json", missing}, "--json " + missing},
      {{"plan", "--svg", missing}, "--svg " + missing},
      {{"scale", "--svg", missing}, "--svg " + missing},
      {{"run", "--json", dir + "/x.json", "--trace", dir + "/./x.json"},
       "--trace " + dir + "/./x.json: the same file as --json"},
  };
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const Outcome o = tspemu(c.args[0] == "plan" ? c.args : tiny(c.args));
    EXPECT_EQ(o.code, 2) << c.args[0] << "\n" << o.err;
    EXPECT_NE(o.err.find(c.message), std::string::npos) << o.err;
    EXPECT_EQ(o.out, "") << "refused after starting work";
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  }
  // A full device: nothing written is a failure, not exit 0.
  const Outcome full = tspemu(tiny({"scale", "--max-ranks", "1", "--json", "/dev/full"}));
  EXPECT_EQ(full.code, 1) << full.err;
  EXPECT_NE(full.err.find("'/dev/full': No space left on device"), std::string::npos) << full.err;
  // A path that is not UTF-8 still gets a whole JSON document, and no temporary is left.
  const std::string odd = dir + "/r\xff.json";
  const Outcome ok = tspemu(tiny({"run", "--json", odd, "--trace", dir + "/t\xfe.json"}));
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(read_json(odd)["command"], "run");
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 2);
  std::filesystem::remove_all(dir);
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

TEST(Cli, CompareWithASimulatedClockAddsEachStrategysEstimate) {
  const std::string json = temp_path("compare.json");
  const Outcome o =
      tspemu(tiny({"compare", "--no-check", "--sim-clock", "network", "--json", json}));
  ASSERT_EQ(o.code, 0) << o.err << o.out;
  EXPECT_NE(o.out.find("sim ms"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("(model network: "), std::string::npos) << o.out;
  const nlohmann::json j = read_json(json);
  int estimated = 0;
  for (const auto& row : j["rows"])
    if (row["skipped"].is_null()) {
      EXPECT_GT(row["simulated_seconds"].get<double>(), 0) << row["strategy"];
      ++estimated;
    }
  EXPECT_GE(estimated, 4);
  EXPECT_EQ(j["simulated"]["alpha_s"].get<double>(), 10e-6);
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

// The acceptance command of issue 14 (docs/design/overlap-on-a-cluster-model.md), at a size CI
// affords (h 64, S 256 instead of h 256, S 8K): every strategy's simulated split is consistent per
// rank — the step is the slowest rank's compute + exposed communication (the compute stream is busy
// or waiting), no rank past it, overlapped never above compute — and the printed per-rank table
// carries a line per strategy. The numbers themselves are that page's, not asserted.
TEST(Cli, CompareOnTwoNodesReportsAConsistentSimulatedSplitPerRank) {
  const std::string json = temp_path("acceptance.json");
  const Outcome o = tspemu({"compare",    "--ranks", "8",           "--layers-only",
                            "--layers",   "1",       "--hidden",    "64",
                            "--heads",    "8",       "--kv-heads",  "8",
                            "--ffn",      "128",     "--seq",       "256",
                            "--no-check", "-q",      "--sim-clock", "mi300x-if",
                            "--nodes",    "2",       "--json",      json});
  ASSERT_EQ(o.code, 0) << o.err << o.out;
  EXPECT_NE(o.out.find("simulated time per rank, ms: compute/exposed/overlapped"),
            std::string::npos)
      << o.out;
  const nlohmann::json j = read_json(json);
  int rows = 0;
  for (const auto& row : j["rows"]) {
    if (!row["skipped"].is_null()) continue;
    ++rows;
    const std::string name = row["strategy"].get<std::string>();
    SCOPED_TRACE(name);
    EXPECT_NE(o.out.find("\n" + name), std::string::npos);
    const double step = row["simulated_seconds"].get<double>();
    double slowest = 0;
    ASSERT_EQ(row["simulated_per_rank"].size(), 8u);
    for (const auto& t : row["simulated_per_rank"]) {
      const double c = t["compute_seconds"].get<double>(),
                   e = t["exposed_comm_seconds"].get<double>(),
                   v = t["overlapped_comm_seconds"].get<double>();
      EXPECT_GE(e, 0);
      EXPECT_GE(v, 0);
      EXPECT_LE(v, c);
      EXPECT_LE(c + e, step + 1e-9);
      slowest = std::max(slowest, c + e);
    }
    EXPECT_NEAR(slowest, step, 1e-9);
  }
  EXPECT_EQ(rows, 8);
  std::filesystem::remove(json);
}

TEST(Cli, RuntimeFailuresExitOne) {
  // A report that cannot be written once the run is done (an unwritable path is refused up front,
  // exit 2: OutputsAreCheckedBefore...).
  const Outcome o = tspemu(tiny({"run", "--json", "/dev/full"}));
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_NE(o.err.find("cannot write '/dev/full': No space left on device"), std::string::npos)
      << o.err;
}

TEST(Cli, HelpExplainsEveryOptionWithItsDefault) {
  for (const char* sub : {"run", "compare", "plan", "scale"}) {
    const Outcome o = tspemu({sub, "--help"});
    EXPECT_EQ(o.code, 0) << sub;
    EXPECT_NE(o.out.find("--config"), std::string::npos) << sub;
    EXPECT_NE(o.out.find("--json"), std::string::npos) << sub;
  }
  const Outcome run = tspemu({"run", "--help"});
  EXPECT_NE(run.out.find("--seq INT=2048"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("--strategy TEXT:{tsp,tp,megatron-sp,sp,ulysses,ring,tp-sp}=tsp"),
            std::string::npos);
  EXPECT_NE(tspemu({"plan", "--help"}).out.find("--device-mem TEXT=80GB"), std::string::npos);
}

TEST(Cli, ConfigFileSetsOptionsAndTheCommandLineOverridesThem) {
  const std::string config = temp_path("config.json"), json = temp_path("run.json");
  {
    std::ofstream f(config);
    f << R"({"strategy": "sp", "ranks": 2, "seq": 64, "layers": 1, "hidden": 32, "heads": 4,
             "kv-heads": 4, "ffn": 48, "quiet": true})";
  }
  const Outcome o = tspemu({"run", "--config", config, "--seq", "32", "--json", json});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  const auto c = read_json(json).at("config");
  EXPECT_EQ(c.at("strategy"), "SP Sp=2");  // from the file
  EXPECT_EQ(c.at("S"), 32);                // the command line wins
  {
    std::ofstream f(config);
    f << R"({"sequence": 64})";
  }
  const Outcome bad = tspemu({"run", "--config", config});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("\"sequence\" is not an option of `tspemu run`"), std::string::npos)
      << bad.err;
  std::remove(config.c_str());
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

// tspemu paper writes the six figures (well-formed SVG with drawn marks), the page and a table row
// for every published number; the memory rows under both assumption sets, the crossing exactly 8h.
TEST(Cli, PaperWritesSixFiguresThePageAndARowForEveryPublishedNumber) {
  const std::string dir = temp_path("paper");
  std::filesystem::remove_all(dir);
  const Outcome o = tspemu({"paper", "--out", dir});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  for (const char* f : {"figure1", "figure5", "figure6", "figure7", "figure9", "figure10"}) {
    const std::string doc = read_file(dir + "/" + f + ".svg");
    std::string why;
    EXPECT_TRUE(well_formed(doc, "svg", &why)) << f << ": " << why;
    EXPECT_TRUE(doc.find("<polyline") != std::string::npos ||
                doc.find("<path") != std::string::npos || doc.find("<rect x") != std::string::npos)
        << f;
  }
  const nlohmann::json j = read_json(dir + "/paper.json");
  expect_document(j, "paper");
  const auto& rows = j.at("rows");
  ASSERT_EQ(rows.size(), 11u);  // 6 memory points, crossing, 128K ratio, 2 throughputs, ratio
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(rows[i].at("unit"), "GB");
    EXPECT_GT(rows[i].at("tspemu").get<double>(), 0);
    EXPECT_GT(rows[i].at("tspemu_megatron").get<double>(), rows[i].at("tspemu").get<double>())
        << "18 B/param holds more than 16";
  }
  EXPECT_EQ(rows[6].at("published"), 32768.0);
  EXPECT_EQ(rows[6].at("tspemu"), 32768.0);
  EXPECT_DOUBLE_EQ(rows[7].at("tspemu").get<double>(), 0.625);
  EXPECT_GT(rows[8].at("tspemu").get<double>(), 0);  // tokens/s from the time model
  const std::string page = read_file(dir + "/index.html");
  EXPECT_GT(std::count(page.begin(), page.end(), '\n'), 10);
  EXPECT_NE(page.find("megatron-mi300x"), std::string::npos);
  EXPECT_NE(page.find("18 B/param"), std::string::npos);  // the assumptions are on the page
  std::filesystem::remove_all(dir);
}

// The page opened by a real browser (Debian's Chromium, headless): its script finds every figure
// laid out with drawn marks (SVG bounding boxes, so layout ran) and says so in the DOM.
TEST(Cli, PaperPageRendersEveryFigureInHeadlessChromium) {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it)";
  const std::string dir = temp_path("paper_browser");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(tspemu({"paper", "--out", dir}).code, 0);
  const std::string dom = dir + "/dom.html";
  const std::string cmd =
      "timeout 120 chromium --headless --no-sandbox --disable-gpu "
      "--disable-dev-shm-usage --dump-dom file://" +
      dir + "/index.html > " + dom + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string got = read_file(dom);
  EXPECT_NE(got.find("figures rendered: 6 of 6"), std::string::npos) << got.substr(0, 2000);
  std::size_t rendered = 0;
  for (auto at = got.find("data-rendered=\"yes\""); at != std::string::npos;
       at = got.find("data-rendered=\"yes\"", at + 1))
    ++rendered;
  EXPECT_EQ(rendered, 6u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tspemu::app
