// Line charts written as SVG by hand (no library): panels side by side, one polyline per series
// with a legend, axes with tick labels, optional horizontal reference lines (a device's capacity).
// x may be on a log2 scale (sequence lengths, rank counts double); y is linear from 0.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tspemu::app {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in order
};

struct Panel {
  std::string title, x_label, y_label;
  bool log2_x = false;
  std::vector<Series> series;
  std::vector<std::pair<double, std::string>> hlines;   // y, label (dashed)
  std::vector<std::pair<double, std::string>> x_ticks;  // empty: every distinct x, printed %g
};

// A complete SVG document.
std::string svg_chart(const std::string& title, const std::vector<Panel>& panels);
// Writes svg_chart(...) to path; throws std::runtime_error if it cannot.
void write_svg(const std::string& path, const std::string& title, const std::vector<Panel>& panels);

}  // namespace tspemu::app
