// --config FILE (config_file.hpp): a path that is not a readable regular JSON file is exit 2 with
// a message naming it on every subcommand, never an uncaught exception or a hang; hostile documents
// are refused with short, printable messages.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "cli_outcome.hpp"
#include "config_file.hpp"
#include "problem_options.hpp"

namespace tspemu::app {
namespace {

using testing::Outcome;
using testing::tspemu;

// A fresh directory for this test, removed with everything in it at the end of the test.
class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() / (std::string("tspemu_") + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(ConfigFile, ADirectoryIsExitTwoNamingItOnEverySubcommand) {
  for (const char* sub : {"run", "compare", "plan", "scale", "selfcheck"}) {
    const Outcome o = tspemu({sub, "--config", dir_.string()});
    EXPECT_EQ(o.code, 2) << sub << ": " << o.err;
    EXPECT_NE(o.err.find("--config " + dir_.string() + ": is a directory"), std::string::npos)
        << sub << ": " << o.err;
  }
  const Outcome eq = tspemu({"plan", "--config=" + dir_.string()});
  EXPECT_EQ(eq.code, 2) << eq.err;
  EXPECT_NE(eq.err.find("is a directory"), std::string::npos) << eq.err;
}

TEST_F(ConfigFile, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = path("config.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Outcome o = tspemu({"plan", "--config", fifo});
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("--config " + fifo + ": not a regular file"), std::string::npos) << o.err;
}

TEST_F(ConfigFile, AFileOverOneMebibyteIsRefusedBeforeReading) {
  const std::string big = path("big.json");
  {
    std::ofstream f(big);
    f << "{\"seq\": \"" << std::string((1 << 20) + 1, ' ') << "\"}";
  }
  const Outcome o = tspemu({"plan", "--config", big});
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("a config file is at most 1048576 bytes"), std::string::npos) << o.err;
}

TEST_F(ConfigFile, AnEmptyFileIsNotJson) {
  const std::string empty = path("empty.json");
  std::ofstream(empty).close();
  const Outcome o = tspemu({"run", "--config", empty});
  EXPECT_EQ(o.code, 2) << o.err;
  EXPECT_NE(o.err.find("--config " + empty + ": not JSON"), std::string::npos) << o.err;
}

// A subcommand with one option of each kind the parser distinguishes.
struct Subcommand {
  Subcommand() {
    sub = app.add_subcommand("plan");
    sub->add_option("--seq", seq);
    sub->add_option("--tag", tags);
    sub->add_flag("--quiet", quiet);
    sub->add_option("--config", config);
  }
  CLI::App app;
  CLI::App* sub = nullptr;
  int seq = 0;
  std::vector<std::string> tags;
  bool quiet = false;
  std::string config;
};

TEST(ConfigOptions, GivesEachKeyAsCommandLineWordsInKeyOrder) {
  Subcommand s;
  EXPECT_EQ(config_options(*s.sub, R"({"seq": 64, "tag": ["a", "b"], "quiet": true})", "c.json"),
            (std::vector<std::string>{"--quiet", "--seq", "64", "--tag", "a", "--tag", "b"}));
  EXPECT_EQ(config_options(*s.sub, R"({"quiet": false, "command": "plan"})", "c.json"),
            std::vector<std::string>{});
}

TEST(ConfigOptions, RefusesWithConfigErrorNamingTheKey) {
  Subcommand s;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "--config c.json: the file must hold a JSON object"},
      {"{\"seq\": ", "--config c.json: not JSON"},
      {R"({"seq": {"a": 1}})", "\"seq\" must be a string or a number"},
      {R"({"seq": [[1]]})", "\"seq\" must be a string or a number"},
      {R"({"quiet": 1})", "\"quiet\" is a flag: true or false"},
      {R"({"config": "x.json"})", "\"config\" is not an option of `tspemu plan`"},
      {R"({"sequence": 1})", "\"sequence\" is not an option of `tspemu plan`"},
      {R"({"seq": [1004, 1024]})", "\"seq\" takes one value, not a list"},
      {R"({"seq": 1004, "seq": 1024})", "\"seq\" is given twice"},
      {R"({"quiet": true, "tag": "a", "quiet": false})", "\"quiet\" is given twice"},
  };
  for (const auto& [json, message] : cases) {
    try {
      config_options(*s.sub, json, "c.json");
      ADD_FAILURE() << "accepted: " << json;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

TEST(ConfigOptions, QuotesAHostileKeyShortAndPrintable) {
  Subcommand s;
  const std::string key = "\x1b[31m" + std::string(100000, 'k');
  try {
    config_options(*s.sub, "{\"\\u001b[31m" + std::string(100000, 'k') + "\": 1}", "c.json");
    ADD_FAILURE() << "accepted a key of " << key.size() << " bytes";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_LT(what.size(), 300u) << what;
    EXPECT_NE(what.find("\\x1b[31mkkk"), std::string::npos) << what;
    EXPECT_NE(what.find("(100005 bytes)"), std::string::npos) << what;
    EXPECT_EQ(what.find('\x1b'), std::string::npos) << "a raw escape reaches the terminal";
  }
}

}  // namespace
}  // namespace tspemu::app
