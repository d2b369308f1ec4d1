#include "output_files.hpp"

#include <filesystem>
#include <system_error>

#include "problem_options.hpp"
#include "tspemu/core/atomic_file.hpp"
#include "tspemu/core/sanitized.hpp"

namespace tspemu::app {

void check_output_files(const std::vector<std::pair<std::string, std::string>>& flag_paths) {
  std::vector<std::pair<std::string, std::filesystem::path>> seen;  // flag, resolved path
  for (const auto& [flag, path] : flag_paths) {
    if (path.empty()) continue;
    const std::string named = flag + " " + sanitized(path, 256);
    try {
      check_writable(path);
    } catch (const FileWriteError& e) {
      throw ConfigError(named + ": " + e.what());
    }
    std::error_code ec;
    // Devices and FIFOs (/dev/null) are written in place and may take several outputs.
    const auto status = std::filesystem::status(path, ec);
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) continue;
    const std::filesystem::path resolved = std::filesystem::weakly_canonical(path, ec);
    for (const auto& [other, where] : seen)
      if (!ec && where == resolved)
        throw ConfigError(named + ": the same file as " + other +
                          "; give each output its own file");
    seen.emplace_back(flag, ec ? std::filesystem::path(path) : resolved);
  }
}

}  // namespace tspemu::app
