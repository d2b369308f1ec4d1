// Printing and JSON of a StackResult, shared by `run` (the full report), `compare` and `scale`
// (one summary row per run).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iosfwd>
#include <string>

#include "layer_stack.hpp"

namespace tspemu::app {

// The report of `run`: time, peak memory per rank by category, bytes per collective measured vs
// model, accuracy per tensor, verdict.
void print_report(std::ostream& out, const StackConfig& c, const StackResult& r);
nlohmann::json report_json(const StackConfig& c, const StackResult& r);

// One row's numbers: max over ranks of the peak and of the bytes received in forward / backward.
struct Summary {
  double peak_bytes = 0;
  double forward_bytes = 0, backward_bytes = 0;
};
Summary summarize(const StackResult& r);
nlohmann::json config_json(const StackConfig& c);

// A JSON document with the keys every subcommand's starts with.
nlohmann::json document(const char* command);
// The simulated clock's parameters, and a run's per-rank compute / exposed / overlapped seconds.
nlohmann::json sim_clock_json(const SimClockModel& m);
nlohmann::json simulated_time_json(const StackResult& r);
// Writes j to path (throws std::runtime_error if it cannot).
void write_json(const std::string& path, const nlohmann::json& j);

std::string mib(double bytes);  // "12.34"
// s padded with spaces to `width` characters as a terminal shows them (UTF-8 code points, so
// "TP+SP T=2×Σ=4" lines up with ASCII names); s itself when it is as wide or wider.
std::string padded(const std::string& s, std::size_t width);
// printf into a string of whatever length the arguments need (a model name or a path is the
// user's, so a fixed buffer would cut a report short without saying so).
std::string fmt(const char* f, auto... args) {
  const int n = std::snprintf(nullptr, 0, f, args...);
  if (n <= 0) return {};
  std::string s(static_cast<std::size_t>(n), '\0');
  std::snprintf(s.data(), s.size() + 1, f, args...);
  return s;
}

}  // namespace tspemu::app
