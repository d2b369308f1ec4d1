#include "config_file.hpp"

#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <set>
#include <system_error>

#include "option_table.hpp"
#include "problem_options.hpp"
#include "tspemu/core/regular_file.hpp"
#include "tspemu/core/sanitized.hpp"

namespace tspemu::app {

namespace {

// A config file holds a few options; anything larger is a mistake (a checkpoint, a log), refused
// before it is read into memory.
constexpr std::uintmax_t kMaxConfigBytes = 1 << 20;

// The whole file, or ConfigError naming it: a directory, a FIFO or a device is refused before it is
// opened (reading a directory throws std::ios_base::failure from the stream buffer; a FIFO without
// a writer blocks forever), and a read error is reported rather than thrown past the parse phase.
std::string read_config_file(const std::string& path) {
  const std::string flag = "--config " + sanitized(path, 256);
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec) throw ConfigError(flag + ": cannot read the file (" + ec.message() + ")");
  if (std::filesystem::is_directory(status))
    throw ConfigError(flag + ": is a directory; give a JSON file");
  if (!std::filesystem::is_regular_file(status))
    throw ConfigError(flag + ": not a regular file; give a JSON file");
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw ConfigError(flag + ": cannot read the file (" + ec.message() + ")");
  if (size > kMaxConfigBytes)
    throw ConfigError(flag + ": " + std::to_string(size) + " bytes; a config file is at most " +
                      std::to_string(kMaxConfigBytes) + " bytes");
  try {  // on the opened descriptor again: the file may have been swapped since the stat
    return read_regular_file(path, kMaxConfigBytes, "a config file's bound");
  } catch (const FileReadError& e) {
    throw ConfigError(flag + ": " + e.reason());
  }
}

}  // namespace

std::vector<std::string> config_options(const CLI::App& sub, std::string_view json,
                                        const std::string& path) {
  const std::string flag = "--config " + sanitized(path, 256);
  nlohmann::json j;
  // The keys seen in each object being parsed: a repeated key would silently replace the value.
  std::vector<std::set<std::string>> keys;
  const nlohmann::json::parser_callback_t refuse_duplicates =
      [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::object_start) keys.emplace_back();
        if (event == nlohmann::json::parse_event_t::object_end) keys.pop_back();
        if (event == nlohmann::json::parse_event_t::key &&
            !keys.back().insert(parsed.get<std::string>()).second)
          throw ConfigError(flag + ": \"" + sanitized(parsed.get<std::string>()) +
                            "\" is given twice; give each option once");
        return true;
      };
  try {
    j = nlohmann::json::parse(json, refuse_duplicates);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(flag + ": not JSON (" + sanitized(e.what(), 200) + ")");
  }
  if (!j.is_object()) throw ConfigError(flag + ": the file must hold a JSON object");
  std::vector<std::string> out;
  for (const auto& [key, value] : j.items()) {
    if (key == "command" || key == "schema_version") continue;  // documents may say what they are
    const std::string name = "\"" + sanitized(key) + "\"";
    const CLI::Option* opt = sub.get_option_no_throw("--" + key);
    if (opt == nullptr || key == "config")
      throw ConfigError(flag + ": " + name + " is not an option of `tspemu " + sub.get_name() +
                        "` (see --help)");
    const bool is_flag = opt->get_items_expected_min() == 0;
    // The option table's kind (option_table.hpp) says which JSON types a value may have: a
    // numeric option takes a JSON number (a string "0.9" is a mistake the file's author should
    // see), a true/false option a JSON boolean or the text true/false.
    const OptionRule* rule = option_rule(sub.get_name(), "--" + key);
    auto text = [&](const nlohmann::json& v) -> std::string {
      if (rule != nullptr && json_needs_number(*rule) && !v.is_number())
        throw ConfigError(flag + ": " + name + " must be a JSON number, not " +
                          std::string(v.type_name()) +
                          (v.is_string() ? " \"" + sanitized(v.get<std::string>()) + "\"" : ""));
      if (v.is_string()) return v.get<std::string>();
      if (v.is_number()) return v.dump();
      if (v.is_boolean() && rule != nullptr && rule->kind == OptionKind::boolean)
        return v.get<bool>() ? "true" : "false";
      throw ConfigError(flag + ": " + name + " must be a string or a number");
    };
    if (is_flag) {
      if (!value.is_boolean()) throw ConfigError(flag + ": " + name + " is a flag: true or false");
      if (value.get<bool>()) out.push_back("--" + key);
    } else if (value.is_array()) {
      std::vector<std::string> values;
      for (const auto& v : value) values.push_back(text(v));
      // Only an option that takes several values may be given a list: the last of a list would
      // silently win over the others.
      if (opt->get_items_expected_max() <= 1 && values.size() != 1)
        throw ConfigError(flag + ": " + name + " takes one value, not a list of " +
                          std::to_string(values.size()));
      for (const std::string& v : values) {
        out.push_back("--" + key);
        out.push_back(v);
      }
    } else {
      out.push_back("--" + key);
      out.push_back(text(value));
    }
  }
  return out;
}

std::vector<std::string> expand_config_files(const CLI::App& app, std::vector<std::string> args) {
  std::size_t at = 0;  // the subcommand's position
  const CLI::App* sub = nullptr;
  for (; at < args.size(); ++at) {
    if (args[at].rfind('-', 0) == 0) continue;
    try {
      sub = app.get_subcommand(args[at]);
    } catch (const CLI::OptionNotFound&) {
    }
    break;
  }
  if (sub == nullptr) return args;
  std::vector<std::string> rest, from_files;
  for (std::size_t i = at + 1; i < args.size(); ++i) {
    std::string path;
    if (args[i] == "--config") {
      if (i + 1 >= args.size()) throw ConfigError("--config: needs a file name");
      path = args[++i];
    } else if (args[i].rfind("--config=", 0) == 0) {
      path = args[i].substr(9);
    } else {
      rest.push_back(args[i]);
      continue;
    }
    const auto opts = config_options(*sub, read_config_file(path), path);
    from_files.insert(from_files.end(), opts.begin(), opts.end());
  }
  std::vector<std::string> out(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  out.insert(out.end(), from_files.begin(), from_files.end());
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

}  // namespace tspemu::app
