// Charts written as SVG by hand (no library; Debian 12 packages no maintained C++ charting
// library that writes SVG files, see `tspemu paper`): panels side by side, each either lines (one
// polyline per series, or markers alone for measured/published points, with a legend) or stacked
// bars (one bar per group, one colour per stack), axes with tick labels, optional horizontal
// reference lines (a device's capacity). x may be on a log2 scale (sequence lengths, rank counts
// double); y is linear from 0.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tspemu::app {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in order
  bool markers_only = false;                      // points as large diamonds, no line
};

// Stacked bars: values[stack][group], drawn bottom-up in stack order.
struct Bars {
  std::vector<std::string> groups;
  std::vector<std::string> stacks;
  std::vector<std::vector<double>> values;
};

struct Panel {
  std::string title, x_label, y_label;
  bool log2_x = false;
  std::vector<Series> series;
  std::vector<std::pair<double, std::string>> hlines;   // y, label (dashed)
  std::vector<std::pair<double, std::string>> x_ticks;  // empty: every distinct x, printed %g
  Bars bars;  // when it has groups, the panel is a bar chart and series are ignored
};

// A complete SVG document.
std::string svg_chart(const std::string& title, const std::vector<Panel>& panels);
// Writes svg_chart(...) to path; throws std::runtime_error if it cannot.
void write_svg(const std::string& path, const std::string& title, const std::vector<Panel>& panels);

}  // namespace tspemu::app
