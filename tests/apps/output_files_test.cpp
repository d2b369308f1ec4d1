// The command's output files (output_files.hpp): checked before the run, naming the flag, and
// written whole or not at all; a report that cannot be written after the run exits 1.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_outcome.hpp"
#include "cli_test_support.hpp"

namespace tspemu::app {
namespace {

using namespace testing;  // cli_outcome.hpp, cli_test_support.hpp

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

TEST(Cli, RuntimeFailuresExitOne) {
  // A report that cannot be written once the run is done (an unwritable path is refused up front,
  // exit 2: OutputsAreCheckedBefore...).
  const Outcome o = tspemu(tiny({"run", "--json", "/dev/full"}));
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_NE(o.err.find("cannot write '/dev/full': No space left on device"), std::string::npos)
      << o.err;
}

}  // namespace
}  // namespace tspemu::app
