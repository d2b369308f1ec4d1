#include "quantity.hpp"

#include <cctype>
#include <cmath>
#include <exception>
#include <utility>

#include "problem_options.hpp"

namespace tspemu::app {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Splits "80GiB" into 80 and "gib".
std::pair<double, std::string> number_and_unit(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw ConfigError(flag + " " + text + ": not a number");
  }
  if (!(v > 0) || !std::isfinite(v)) throw ConfigError(flag + " " + text + ": must be positive");
  return {v, lower(text.substr(used))};
}

}  // namespace

std::int64_t parse_count(const std::string& flag, const std::string& text) {
  const auto [v, unit] = number_and_unit(flag, text);
  const double scale = unit.empty() ? 1 : unit == "k" ? 1024 : unit == "m" ? 1024.0 * 1024 : 0;
  if (scale == 0 || v * scale != std::floor(v * scale))
    throw ConfigError(flag + " " + text + ": a whole count, optionally with K (1024) or M");
  // Bounded before the cast (a double beyond int64 converts to an undefined
  // value), and so that products of counts in the figures stay far inside
  // int64.
  if (!(v * scale >= 1 && v * scale <= static_cast<double>(kMaxCount)))
    throw ConfigError(flag + " " + text + ": must be between 1 and " + std::to_string(kMaxCount) +
                      " (1T tokens)");
  return static_cast<std::int64_t>(v * scale);
}

double parse_bytes(const std::string& flag, const std::string& text) {
  const auto [v, unit] = number_and_unit(flag, text);
  static const std::pair<const char*, double> units[] = {
      {"b", 1},           {"kb", 1e3},           {"mb", 1e6},
      {"gb", 1e9},        {"tb", 1e12},          {"kib", 1024.0},
      {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (unit == name) return v * scale;
  throw ConfigError(flag + " " + text + ": give a unit, e.g. 80GB or 80GiB");
}

}  // namespace tspemu::app
