// libFuzzer harness: the tspemu command's --config parser (apps/config_file.hpp) on arbitrary
// bytes, then CLI11 on the words it produces, as tspemu_main does. The subcommand has one option
// of each kind config_options tells apart (a scalar, a list, a flag, and --config itself, which a
// document may not set): its behaviour depends on the subcommand only through those kinds, and
// the real subcommands would bring the whole schedule code into the fuzz build.
// Property: config_options returns words or throws ConfigError, and CLI11 then parses them or
// throws CLI::ParseError; tspemu_main catches exactly those two in its parse phase, so any other
// exception, a crash or undefined behaviour is a finding.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config_file.hpp"
#include "problem_options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tspemu::app;
  CLI::App app{"fuzz", "tspemu"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  CLI::App* sub = app.add_subcommand("run");
  int seq = 0;
  double probability = 0;
  std::string strategy, config;
  std::vector<std::string> tags;
  bool quiet = false;
  sub->add_option("--seq", seq)->check(CLI::Range(1, 1 << 20));
  sub->add_option("--inject-probability", probability);
  sub->add_option("--strategy", strategy)->check(CLI::IsMember({"tsp", "tp", "sp"}));
  sub->add_option("--tag", tags);
  sub->add_flag("--quiet,-q", quiet);
  sub->add_option("--config", config);
  std::vector<std::string> words;
  try {
    words = config_options(*sub, std::string_view(reinterpret_cast<const char*>(data), size),
                           "fuzz.json");
  } catch (const ConfigError&) {
    return 0;
  }
  words.insert(words.begin(), "run");
  std::reverse(words.begin(), words.end());  // CLI11 takes a vector in reverse order
  try {
    app.parse(words);
  } catch (const CLI::ParseError&) {
  }
  return 0;
}
