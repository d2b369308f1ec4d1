// --config FILE: options of a subcommand from a JSON object, e.g. for `tspemu run`
//   {"strategy": "tp-sp", "tp": 2, "sp": 2, "seq": 4096, "pin": true}
// Keys are the subcommand's long option names without "--"; values are strings, numbers, true
// (a flag that is set) or lists. The file's options are placed before the command line's, and
// every option keeps its last value, so flags given on the command line override the file.
#pragma once

#include "cli_fwd.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace tspemu::app {

// args: the command line without the program name. Returns it with every --config FILE replaced
// by the file's options. Throws ConfigError for a file that is not a readable regular file of at
// most 1 MiB (a directory, a FIFO, a device), or anything config_options refuses.
std::vector<std::string> expand_config_files(const CLI::App& app, std::vector<std::string> args);

// The options one --config document gives the subcommand `sub`, as command-line words in key
// order (a JSON object is unordered); `path` names the document in errors. Throws ConfigError (and
// nothing else) for text that is not a JSON object, a key that is not an option of `sub`, or a
// value of the wrong kind; keys and parser messages are quoted as at most 64 printable bytes.
std::vector<std::string> config_options(const CLI::App& sub, std::string_view json,
                                        const std::string& path);

}  // namespace tspemu::app
