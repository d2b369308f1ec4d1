// The option table: every valued option of every subcommand with its kind and bounds, one row each
// (kOptionRules), checked while the command line is parsed, before any command runs.
//
// What: a rule names the subcommands it applies to, the long flag, the kind of value (an integer,
// a finite number, a seed, a byte size, a count with a K/M suffix, a true/false, a text), its
// closed or open range, the units and what the option sets. apply_option_table attaches the
// rule of every option of every subcommand as the option's first validator, so the command line
// and --config (whose options are expanded into the command line, config_file.hpp) are checked
// alike; config_options uses json_needs_number to refuse a JSON string for a numeric option.
// Guarantees: a value outside its rule throws ConfigError (exit 2) whose message names the flag,
// the value as given (sanitized) and the bound it broke, then the whole range, e.g.
//   --total-devices 0: must be >= 1 (an integer in [1, 1048576])
// NaN and infinities are refused for every numeric kind, an empty text for every text option.
// Commands still check what depends on several values (divisibility, ranks of a mesh, memory).
// Cost: one table scan per option at start-up.
#pragma once

#include "cli_fwd.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace tspemu::app {

enum class OptionKind {
  integer,  // decimal integer in [min, max]
  seed,     // decimal integer in [0, 2^64 - 1]
  real,     // finite number in [min, max] ((min, max] when min_open)
  size,     // bytes: a number with an optional unit (kB, MB, GB, KiB, MiB, GiB, ...), given to
            // the option as the whole number of bytes, in [min, max]
  bytes,    // bytes: a number with a required unit (80GB, 96GiB; "0" when min is 0), in [min, max]
  count,    // a count with an optional K (1024) or M suffix, in [1, 2^40] (plan_command.hpp)
  boolean,  // true or false
  text,     // any non-empty text (names, paths, lists); the command checks its content
};

struct OptionRule {
  std::string_view commands;  // space-separated subcommands, e.g. "run compare scale train"
  std::string_view flag;      // the long flag, e.g. "--peak"
  OptionKind kind;
  double min = 0, max = 0;  // unused by seed, count, boolean and text
  bool min_open = false;    // real: min itself refused
  bool max_open = false;    // real: max itself refused
  std::string_view units;   // e.g. "TFLOP/s", shown after the range
  std::string_view what;
  std::string_view why = "";  // the reason for a bound, added to its message
};

// The table, one row per option (docs/commands.md: Option bounds, renders it).
const std::vector<OptionRule>& option_rules();

// The rule of `flag` on subcommand `command`, or nullptr.
const OptionRule* option_rule(std::string_view command, std::string_view flag);

// "" when `text` satisfies `rule`, otherwise the message (without the "tspemu: invalid
// configuration: " prefix). For kind size, `normalized` receives the whole number of bytes.
std::string option_error(const OptionRule& rule, const std::string& text,
                         std::string* normalized = nullptr);

// The range of `rule` as the messages state it, e.g. "an integer in [1, 256]".
std::string describe_range(const OptionRule& rule);

// Attaches to every option of every subcommand of `app` its rule as the first validator (throwing
// ConfigError). Returns the options no rule covers, as "command --flag" (empty in a correct build:
// tests/apps/option_table_test.cpp checks it).
std::vector<std::string> apply_option_table(CLI::App& app);

// Whether a --config value for this rule must be a JSON number (integer, seed, real).
bool json_needs_number(const OptionRule& rule);

}  // namespace tspemu::app
