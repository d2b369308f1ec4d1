// `tspemu paper`: the analytic model against the TSP paper (arXiv 2604.26294 and the authors'
// post; TSP-NOTES.md). Writes, into --out DIR, SVG redraws of the paper's Figures 1 (stacked
// per-category memory per strategy at 128K), 5 (forward volume and memory vs S), 6 (the same vs
// parameter count over a fixed-g, fixed-F family), 7 (TSP/TP forward volume vs B·S with
// 1/2 + 4h/(B·S)), 9 (peak memory vs S on 192 GB MI300X with the published points) and 10
// (throughput: the published point; tspemu has no time model yet, said on the figure), plus
// index.html showing them inline with the "published / tspemu / ratio" table for every published
// number under two assumption sets — the default and megatron-mi300x (memory_assumptions.hpp) —
// and the assumptions themselves; paper.json holds the table.
//
// Charts: apps/svg_chart (hand-written). Debian 12 offers no maintained C++ library that writes
// chart SVG files (libplplot-dev is a C plotting library with global state and its own fonts;
// gnuplot and gnuplot-iostream drive an external program; libsciplot is a GTK widget), and a
// JavaScript library (Chart.js and uPlot draw on a canvas; d3 and Vega are 100s of KiB minified)
// would leave no SVG files without a browser. The page's inline script only checks that every
// figure laid out (a render check for the headless-browser test).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "cli_fwd.hpp"

#include "memory_assumptions.hpp"

namespace tspemu::app {

struct PaperArgs {
  std::string out_dir = "paper";
  AssumptionArgs assumptions;  // the "tspemu" column; megatron-mi300x is always shown beside it
  std::string json_path;
};

CLI::App* add_paper_command(CLI::App& app, PaperArgs& a);
int paper_command(const PaperArgs& a, std::ostream& out);

// One published number and tspemu's figure for it under two assumption sets.
struct PaperComparison {
  std::string quantity, unit, source;
  double published = 0;
  double tspemu = 0, tspemu_megatron = 0;  // NaN: not modelled
  std::string note;
};
// The rows of the table, in the page's order.
std::vector<PaperComparison> paper_comparisons(const tsp::cost::MemoryAssumptions& chosen);

}  // namespace tspemu::app
