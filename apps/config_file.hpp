// --config FILE: options of a subcommand from a JSON object, e.g. for `tspemu run`
//   {"strategy": "tp-sp", "tp": 2, "sp": 2, "seq": 4096, "pin": true}
// Keys are the subcommand's long option names without "--"; values are strings, numbers, true
// (a flag that is set) or lists. The file's options are placed before the command line's, and
// every option keeps its last value, so flags given on the command line override the file.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace tspemu::app {

// args: the command line without the program name. Returns it with every --config FILE replaced
// by the file's options. Throws ConfigError for an unreadable file, a key that is not an option
// of the subcommand, or a value of the wrong kind.
std::vector<std::string> expand_config_files(const CLI::App& app, std::vector<std::string> args);

}  // namespace tspemu::app
