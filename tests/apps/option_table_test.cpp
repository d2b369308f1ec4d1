// The option table (apps/option_table.hpp) as data: every valued option of every subcommand has a
// row whose kind agrees with the parser's type; every row's bounds hold at just below the minimum,
// the minimum, the maximum, just above it, NaN and infinity, on the command line and through
// --config; and the hostile-user cases of issue 41 exit 2 naming the flag and the value, with
// nothing written.
#include <gtest/gtest.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli.hpp"
#include "cli_outcome.hpp"
#include "config_file.hpp"
#include "option_table.hpp"
#include "problem_options.hpp"

namespace tspemu::app {
namespace {

using testing::Outcome;
using testing::temp_path;
using testing::tspemu;

std::vector<std::string> commands_of(const OptionRule& r) {
  std::vector<std::string> v;
  std::string s(r.commands);
  for (std::size_t at = 0; at < s.size();) {
    const std::size_t end = std::min(s.find(' ', at), s.size());
    v.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return v;
}

std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The parse phase only (nothing runs): "" when `args` parse, else the ConfigError's message.
std::string parse_error(const std::vector<std::string>& args) {
  TspemuApp app;
  try {
    std::vector<std::string> argv = expand_config_files(app, args);
    std::reverse(argv.begin(), argv.end());
    app.parse(argv);
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const CLI::ParseError& e) {
    return std::string("CLI11: ") + e.what();
  }
  return "";
}

// A value to try and whether the rule admits it.
struct Probe {
  std::string text;
  bool valid;
  const char* what;
};

// The boundary values of a row: just below the minimum, the minimum, the maximum, just above it,
// NaN and infinity (where the kind has them).
std::vector<Probe> probes(const OptionRule& r) {
  const double inf = std::numeric_limits<double>::infinity();
  switch (r.kind) {
    case OptionKind::integer:
      return {{exact(r.min - 1), false, "below min"},
              {exact(r.min), true, "min"},
              {exact(r.max), true, "max"},
              {exact(r.max + 1), false, "above max"},
              {"nan", false, "nan"},
              {"inf", false, "inf"},
              {"1.5", false, "fraction"}};
    case OptionKind::real:
      return {{exact(r.min_open ? r.min : std::nextafter(r.min, -inf)), false, "below min"},
              {exact(r.min_open ? std::nextafter(r.min, inf) : r.min), true, "min"},
              {exact(r.max_open ? std::nextafter(r.max, -inf) : r.max), true, "max"},
              {exact(r.max_open ? r.max : std::nextafter(r.max, inf)), false, "above max"},
              {"nan", false, "nan"},
              {"inf", false, "inf"}};
    case OptionKind::size:
      return {{"-1", false, "below min"},
              {exact(r.min), true, "min"},
              {exact(r.max), true, "max"},
              {exact(r.max + 1), false, "above max"},
              {"18446744073709551616", false, "2^64"},
              {"nan", false, "nan"},
              {"inf", false, "inf"}};
    case OptionKind::bytes:
      return {{exact(r.min - 1) + "B", false, "below min"},
              {r.min == 0 ? "0" : exact(r.min) + "B", true, "min"},
              {exact(r.max) + "B", true, "max"},
              {exact(r.max * 1.001) + "B", false, "above max"},
              {"nanGB", false, "nan"},
              {"infGB", false, "inf"}};
    case OptionKind::count:
      return {{"0", false, "below min"},        {"1", true, "min"},    {"1048576M", true, "max"},
              {"1048577M", false, "above max"}, {"nan", false, "nan"}, {"inf", false, "inf"}};
    case OptionKind::seed:
      return {{"-1", false, "below min"},
              {"0", true, "min"},
              {"18446744073709551615", true, "max"},
              {"18446744073709551616", false, "above max"},
              {"nan", false, "nan"}};
    case OptionKind::boolean:
      return {{"true", true, "true"},
              {"false", true, "false"},
              {"2", false, "2"},
              {"", false, "empty"}};
    case OptionKind::text:
      return {{"", false, "empty"}};
  }
  return {};
}

// The CLI11 type each kind is stored as: a row cannot claim an integer for a text option.
std::set<std::string> parser_types(OptionKind k) {
  switch (k) {
    case OptionKind::integer:
      return {"INT", "UINT"};
    case OptionKind::seed:
    case OptionKind::size:
      return {"UINT"};
    case OptionKind::real:
      return {"FLOAT"};
    case OptionKind::boolean:
      return {"BOOLEAN"};
    case OptionKind::bytes:
    case OptionKind::count:
    case OptionKind::text:
      return {"TEXT"};
  }
  return {};
}

TEST(OptionTable, EveryValuedOptionOfEveryCommandHasARowOfItsParserType) {
  TspemuApp app;
  EXPECT_TRUE(app.outside_the_table.empty()) << "options without a row in option_table.cpp: "
                                             << ::testing::PrintToString(app.outside_the_table);
  std::set<std::pair<std::string, std::string>> used;
  int options = 0;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt->get_items_expected_max() == 0 || opt->get_lnames().empty()) continue;
      const std::string flag = "--" + opt->get_lnames().front();
      ++options;
      const OptionRule* rule = option_rule(sub->get_name(), flag);
      if (rule == nullptr) continue;  // reported above
      used.insert({sub->get_name(), flag});
      const std::string full = opt->get_type_name();  // e.g. TEXT:{zigzag,...}
      const std::string type = full.substr(0, full.find(':'));
      EXPECT_EQ(parser_types(rule->kind).count(type), 1u)
          << sub->get_name() << " " << flag << " is parsed as " << type;
    }
  EXPECT_GT(options, 100);
  // No row names an option that does not exist: the table says what the parser has.
  for (const OptionRule& r : option_rules())
    for (const std::string& cmd : commands_of(r)) {
      if (r.flag == "--config" && cmd == "selfcheck") continue;  // expanded before parsing
      EXPECT_EQ(used.count({cmd, std::string(r.flag)}), 1u)
          << cmd << " " << r.flag << ": a row for an option the command does not have";
    }
}

TEST(OptionTable, EveryRowsBoundsHoldOnTheCommandLineNamingTheFlagAndTheValue) {
  int checked = 0;
  for (const OptionRule& r : option_rules())
    for (const std::string& cmd : commands_of(r)) {
      if (r.flag == "--config") continue;  // a file, read before parsing (config_file_test.cpp)
      for (const Probe& p : probes(r)) {
        const std::string e = parse_error({cmd, std::string(r.flag), p.text});
        const std::string where =
            cmd + " " + std::string(r.flag) + " '" + p.text + "' (" + p.what + "): " + e;
        ++checked;
        if (p.valid) {
          EXPECT_EQ(e, "") << where;
          continue;
        }
        EXPECT_EQ(e.rfind(std::string(r.flag) + " ", 0), 0u) << where;
        EXPECT_NE(e.find(p.text.empty() ? std::string(" '': ") : " " + p.text + ": "),
                  std::string::npos)
            << where;
      }
    }
  EXPECT_GT(checked, 500);
}

TEST(OptionTable, EveryRowsBoundsHoldThroughConfigFilesToo) {
  const std::string config = temp_path("options.json");
  int checked = 0;
  for (const OptionRule& r : option_rules())
    for (const std::string& cmd : commands_of(r)) {
      if (r.flag == "--config") continue;
      const std::string key(r.flag.substr(2));
      for (const Probe& p : probes(r)) {
        // A numeric option takes a JSON number; NaN and infinity have none and are refused as
        // strings, naming the key and the type.
        const bool number = json_needs_number(r);
        double v = 0;
        const bool finite = number && std::sscanf(p.text.c_str(), "%lf", &v) == 1 &&
                            std::isfinite(v) && p.text.find_first_of("ni") == std::string::npos;
        if (number && !finite && p.valid) continue;
        {
          std::ofstream f(config);
          f << "{\"" << key << "\": " << (finite ? p.text : "\"" + p.text + "\"") << "}";
        }
        const std::string e = parse_error({cmd, "--config", config});
        const std::string where = cmd + " " + key + " = " + p.text + " (" + p.what + "): " + e;
        ++checked;
        if (p.valid) {
          EXPECT_EQ(e, "") << where;
        } else if (number && !finite) {
          EXPECT_NE(e.find("\"" + key + "\" must be a JSON number, not string"), std::string::npos)
              << where;
        } else {
          EXPECT_EQ(e.rfind(std::string(r.flag) + " ", 0), 0u) << where;
        }
      }
    }
  std::remove(config.c_str());
  EXPECT_GT(checked, 300);
}

// Issue 41's cases: accepted with a nonsense result before, each now exit 2 naming the flag and the
// value (the message's start), nothing run.
TEST(OptionTable, TheHostileUsersCasesExitTwoNamingTheFlagAndTheValue) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"run", "--sim-clock", ""}, "--sim-clock '': must not be empty"},
      {{"run", "--sim-clock", "nvlink", "--peak", "-1"}, "--peak -1: must be > 0"},
      {{"run", "--sim-clock", "nvlink", "--peak", "nan"}, "--peak nan: must be finite"},
      {{"run", "--sim-clock", "nvlink", "--peak", "inf"}, "--peak inf: must be finite"},
      {{"run", "--sim-clock", "nvlink", "--peak", "1e308"},
       "--peak 1e308: must be at most 1000000"},
      {{"run", "--sim-clock", "nvlink", "--mfu", "nan"}, "--mfu nan: must be finite"},
      {{"run", "--sim-clock", "nvlink", "--mfu", "-0.1"}, "--mfu -0.1: must be > 0"},
      {{"run", "--sim-clock", "nvlink", "--gpus-per-node", "-1"},
       "--gpus-per-node -1: must be >= 0"},
      {{"run", "--sim-clock", "nvlink", "--intra-alpha-us", "-1"},
       "--intra-alpha-us -1: must be >= 0"},
      {{"run", "--sim-clock", "nvlink", "--intra-alpha-us", "nan"},
       "--intra-alpha-us nan: must be finite"},
      {{"run", "--sim-clock", "nvlink", "--intra-beta-gbs", "inf"},
       "--intra-beta-gbs inf: must be finite"},
      {{"run", "--sim-clock", "nvlink", "--intra-beta-gbs", "-5"},
       "--intra-beta-gbs -5: must be >= 0.001"},
      {{"run", "--sim-clock", "nvlink", "--intra-beta-gbs", "1e-300"},
       "--intra-beta-gbs 1e-300: must be >= 0.001"},
      {{"compare", "--sim-clock", "nvlink", "--nodes", "0"}, "--nodes 0: must be >= 1"},
      {{"plan", "--total-devices", "0"}, "--total-devices 0: must be >= 1"},
      {{"plan", "--device-mem", "1e-30GB"}, "--device-mem 1e-30GB: must be >= 1000000"},
      {{"plan", "--logits-in-place", "2"}, "--logits-in-place 2: must be true or false"},
      {{"run", "--weights", ""}, "--weights '': must not be empty"},
      {{"run", "--save", ""}, "--save '': must not be empty"},
      {{"train", "--save", ""}, "--save '': must not be empty"},
      {{"selfcheck", "--count", "3000000000"}, "--count 3000000000: must be at most 16777216"},
      {{"selfcheck", "--count", "-1"}, "--count -1: must be >= 1"},
      {{"run", "--vocab", "2147483644"}, "--vocab 2147483644: must be at most 16777216"},
      {{"train", "--layers", "2000000"}, "--layers 2000000: must be at most 1048576"},
      // Within the bounds, but past the machine: the memory pre-check `run` has.
      {{"train", "--layers", "100000"}, "memory: train TSP D=4 needs at least "},
      {{"train", "--batch", "65536"}, "memory: train TSP D=4 needs at least "},
  };
  for (const Case& c : cases) {
    const Outcome o = tspemu(c.args);
    EXPECT_EQ(o.code, 2) << ::testing::PrintToString(c.args) << "\n" << o.err;
    EXPECT_NE(o.err.find("tspemu: invalid configuration: " + c.message), std::string::npos)
        << ::testing::PrintToString(c.args) << "\nstderr: " << o.err;
    EXPECT_EQ(o.out, "") << ::testing::PrintToString(c.args);
  }
}

// --save-shard-size -1 and 2^64 saved anyway and left a checkpoint behind; now nothing is created.
TEST(OptionTable, ABadShardSizeIsRefusedBeforeTheSaveDirectoryExists) {
  const std::string dir = temp_path("ck");
  std::filesystem::remove_all(dir);
  for (const char* size : {"-1", "18446744073709551616", "nan", "1e-3"}) {
    const Outcome o =
        tspemu({"run", "-q", "--seq", "32", "--save", dir, "--save-shard-size", size});
    EXPECT_EQ(o.code, 2) << size << ": " << o.err;
    EXPECT_NE(o.err.find(std::string("--save-shard-size ") + size + ": must be"), std::string::npos)
        << o.err;
    EXPECT_FALSE(std::filesystem::exists(dir)) << size;
  }
  // Through --config as well.
  const std::string config = temp_path("save.json");
  {
    std::ofstream f(config);
    f << R"({"save-shard-size": -1, "save": ")" << dir << "\"}";
  }
  const Outcome o = tspemu({"run", "-q", "--config", config});
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("--save-shard-size -1: must be >= 0"), std::string::npos) << o.err;
  EXPECT_FALSE(std::filesystem::exists(dir));
  std::remove(config.c_str());
}

// The same values through --config, and strings for numeric options, refused naming the key and
// the JSON type.
TEST(OptionTable, ConfigFilesAreHeldToTheSameRulesAndTypes) {
  struct Case {
    std::string command, json, message;
  };
  const std::vector<Case> cases = {
      {"run", R"({"sim-clock": ""})", "--sim-clock '': must not be empty"},
      {"run", R"({"sim-clock": "nvlink", "peak": -1})", "--peak -1: must be > 0"},
      {"run", R"({"sim-clock": "nvlink", "peak": 1e308})", "--peak 1e+308: must be at most"},
      {"run", R"({"sim-clock": "nvlink", "mfu": -0.1})", "--mfu -0.1: must be > 0"},
      {"run", R"({"sim-clock": "nvlink", "gpus-per-node": -1})", "--gpus-per-node -1: must be"},
      {"run", R"({"sim-clock": "nvlink", "intra-alpha-us": -1})", "--intra-alpha-us -1: must be"},
      {"run", R"({"sim-clock": "nvlink", "intra-beta-gbs": 1e-300})",
       "--intra-beta-gbs 1e-300: must be >= 0.001"},
      {"run", R"({"sim-clock": "nvlink", "peak": "nan"})",
       "\"peak\" must be a JSON number, not string \"nan\""},
      {"compare", R"({"sim-clock": "nvlink", "nodes": 0})", "--nodes 0: must be >= 1"},
      {"plan", R"({"total-devices": 0})", "--total-devices 0: must be >= 1"},
      {"plan", R"({"device-mem": "1e-30GB"})", "--device-mem 1e-30GB: must be >= 1000000"},
      {"plan", R"({"logits-in-place": 2})", "--logits-in-place 2: must be true or false"},
      {"run", R"({"weights": ""})", "--weights '': must not be empty"},
      {"run", R"({"save": ""})", "--save '': must not be empty"},
      {"run", R"({"vocab": 2147483644})", "--vocab 2147483644: must be at most"},
      {"train", R"({"beta1": "0.9"})", "\"beta1\" must be a JSON number, not string \"0.9\""},
      {"train", R"({"beta1": 1})", "--beta1 1: must be < 1"},
      {"plan", R"({"total-devices": "8"})",
       "\"total-devices\" must be a JSON number, not string \"8\""},
      {"plan", R"({"layers": true})", "\"layers\" must be a JSON number, not boolean"},
  };
  const std::string config = temp_path("config.json");
  for (const Case& c : cases) {
    {
      std::ofstream f(config);
      f << c.json;
    }
    const Outcome o = tspemu({c.command, "--config", config});
    EXPECT_EQ(o.code, 2) << c.json << "\n" << o.err;
    EXPECT_NE(o.err.find(c.message), std::string::npos) << c.json << "\nstderr: " << o.err;
  }
  // A JSON boolean sets a true/false option.
  {
    std::ofstream f(config);
    f << R"({"logits-in-place": true, "total-devices": 16})";
  }
  EXPECT_EQ(parse_error({"plan", "--config", config}), "");
  std::remove(config.c_str());
}

}  // namespace
}  // namespace tspemu::app
