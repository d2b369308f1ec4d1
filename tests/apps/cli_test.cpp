// The tspemu command through its library entry point (cli.hpp) with an argv, across commands:
// bad configurations exit 2 naming the flag and the constraint, an unknown strategy lists the
// known ones, a command that would run nothing is refused, --help documents every option with its
// default, and --config sets options that the command line overrides. Each command's own outputs:
// <command>_command_test.cpp; shared checks: cli_test_support.hpp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cli_outcome.hpp"
#include "cli_test_support.hpp"
#include "problem_options.hpp"
#include "tspemu/plan/strategy_table.hpp"

namespace tspemu::app {
namespace {

using namespace testing;  // cli_outcome.hpp, cli_test_support.hpp

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

// selfcheck times the collectives; like every timed report it names the kernels beside them.
TEST(Cli, SelfcheckNamesTheBlasAndBf16GemmKernels) {
  const Outcome o = tspemu({"selfcheck", "--ranks", "2", "--count", "256", "--iterations", "1"});
  EXPECT_EQ(o.code, 0) << o.err;
  expect_blas_line(o.out);
}

// --precision and --grad-reduce: a bf16 gradient wire in an fp32 run is a contradiction named by
// both flags; bf16 runs are refused by every command until their paths exist (never run as fp32
// under a bf16 label); fp32 spelled out runs as the default does.
TEST(Cli, PrecisionFlagsRefuseBf16GradientsInFp32AndUnimplementedBf16Runs) {
  auto expect_refused = [](const std::vector<std::string>& args, const std::string& message) {
    const Outcome o = tspemu(args);
    EXPECT_EQ(o.code, 2) << args[0] << " " << message;
    EXPECT_NE(o.err.find(message), std::string::npos) << o.err;
  };
  expect_refused({"run", "--grad-reduce", "bf16"},
                 "--grad-reduce bf16 with --precision fp32: an fp32 run keeps and reduces its "
                 "gradients in fp32");
  expect_refused({"train", "--precision", "fp32", "--grad-reduce", "bf16"},
                 "--grad-reduce bf16 with --precision fp32");
  for (const char* command : {"run", "compare", "scale", "train", "generate"})
    expect_refused(
        {command, "--precision", "bf16"},
        std::string(command) + " --precision bf16: bf16 mixed precision is not implemented yet");
  expect_refused({"run", "--precision", "bf16", "--grad-reduce", "bf16"}, "run --precision bf16: ");
  expect_refused({"run", "--precision", "fp16"}, "--precision");
  expect_refused({"generate", "--grad-reduce", "fp32"}, "--grad-reduce");  // no gradients
  const Outcome o =
      tspemu({"run",         "-q",   "--layers",      "1",   "--seq", "256", "--hidden", "64",
              "--heads",     "4",    "--kv-heads",    "4",   "--ffn", "128", "--vocab",  "64",
              "--precision", "fp32", "--grad-reduce", "fp32"});
  EXPECT_EQ(o.code, 0) << o.err;
}

}  // namespace
}  // namespace tspemu::app
