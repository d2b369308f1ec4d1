#include "config_file.hpp"

#include <nlohmann/json.hpp>

#include <fstream>

#include "problem_options.hpp"

namespace tspemu::app {

namespace {

std::vector<std::string> options_of(const CLI::App& sub, const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError("--config " + path + ": cannot read the file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("--config " + path + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw ConfigError("--config " + path + ": the file must hold a JSON object");
  std::vector<std::string> out;
  for (const auto& [key, value] : j.items()) {
    if (key == "command" || key == "schema_version") continue;  // documents may say what they are
    const CLI::Option* opt = sub.get_option_no_throw("--" + key);
    if (opt == nullptr || key == "config")
      throw ConfigError("--config " + path + ": \"" + key + "\" is not an option of `tspemu " +
                        sub.get_name() + "` (see --help)");
    const bool is_flag = opt->get_items_expected_min() == 0;
    auto text = [&](const nlohmann::json& v) -> std::string {
      if (v.is_string()) return v.get<std::string>();
      if (v.is_number()) return v.dump();
      throw ConfigError("--config " + path + ": \"" + key + "\" must be a string or a number");
    };
    if (is_flag) {
      if (!value.is_boolean())
        throw ConfigError("--config " + path + ": \"" + key + "\" is a flag: true or false");
      if (value.get<bool>()) out.push_back("--" + key);
    } else if (value.is_array()) {
      for (const auto& v : value) {
        out.push_back("--" + key);
        out.push_back(text(v));
      }
    } else {
      out.push_back("--" + key);
      out.push_back(text(value));
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_config_files(const CLI::App& app, std::vector<std::string> args) {
  std::size_t at = 0;  // the subcommand's position
  const CLI::App* sub = nullptr;
  for (; at < args.size(); ++at) {
    if (args[at].rfind("-", 0) == 0) continue;
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
    const auto opts = options_of(*sub, path);
    from_files.insert(from_files.end(), opts.begin(), opts.end());
  }
  std::vector<std::string> out(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  out.insert(out.end(), from_files.begin(), from_files.end());
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

}  // namespace tspemu::app
