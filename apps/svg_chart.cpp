#include "svg_chart.hpp"

#include "mpi_job.hpp"

#include "tspemu/core/atomic_file.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace tspemu::app {

namespace {

constexpr double kPanelW = 560, kPanelH = 400;
constexpr double kLeft = 70, kRight = 20, kTop = 40, kBottom = 55;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

std::string escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    switch (c) {
      case '&':
        r += "&amp;";
        break;
      case '<':
        r += "&lt;";
        break;
      case '>':
        r += "&gt;";
        break;
      case '"':
        r += "&quot;";
        break;
      default:
        r += c;
    }
  }
  return r;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string label(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// A "nice" tick step (1, 2 or 5 × 10^k) giving about five ticks up to top.
double tick_step(double top) {
  const double raw = top / 5;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

// The legend entry of series or stack i.
void legend(std::ostringstream& o, double ox, std::size_t i, const std::string& name,
            const char* color, bool box) {
  const double ly = kTop + 14 + 16 * static_cast<double>(i);
  if (box)
    o << "<rect x=\"" << num(ox + kLeft + 12) << "\" y=\"" << num(ly - 10) << "\" width=\"14\" "
      << "height=\"10\" fill=\"" << color << "\"/>\n";
  else
    o << "<line x1=\"" << num(ox + kLeft + 10) << "\" y1=\"" << num(ly - 4) << "\" x2=\""
      << num(ox + kLeft + 30) << "\" y2=\"" << num(ly - 4) << "\" stroke=\"" << color
      << "\" stroke-width=\"2\"/>\n";
  o << "<text x=\"" << num(ox + kLeft + 35) << "\" y=\"" << num(ly) << "\" font-size=\"11\">"
    << escape(name) << "</text>\n";
}

void frame(std::ostringstream& o, const Panel& p, double ox, double ytop, double step) {
  const double pw = kPanelW - kLeft - kRight, ph = kPanelH - kTop - kBottom;
  auto Y = [&](double y) { return kTop + ph - y / ytop * ph; };
  o << "<text x=\"" << num(ox + kPanelW / 2) << "\" y=\"22\" text-anchor=\"middle\" "
    << "font-size=\"15\">" << escape(p.title) << "</text>\n";
  o << "<rect x=\"" << num(ox + kLeft) << "\" y=\"" << num(kTop) << "\" width=\"" << num(pw)
    << "\" height=\"" << num(ph) << "\" fill=\"none\" stroke=\"#000\"/>\n";
  for (double y = 0; y <= ytop + step / 2; y += step) {
    o << "<line x1=\"" << num(ox + kLeft - 4) << "\" y1=\"" << num(Y(y)) << "\" x2=\""
      << num(ox + kLeft + pw) << "\" y2=\"" << num(Y(y)) << "\" stroke=\"#ddd\"/>\n";
    o << "<text x=\"" << num(ox + kLeft - 6) << "\" y=\"" << num(Y(y) + 4)
      << "\" text-anchor=\"end\" font-size=\"11\">" << label(y) << "</text>\n";
  }
  o << "<text x=\"" << num(ox + kLeft + pw / 2) << "\" y=\"" << num(kPanelH - 12)
    << "\" text-anchor=\"middle\" font-size=\"12\">" << escape(p.x_label) << "</text>\n";
  o << "<text transform=\"translate(" << num(ox + 16) << "," << num(kTop + ph / 2)
    << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">" << escape(p.y_label)
    << "</text>\n";
  for (const auto& [y, text] : p.hlines) {
    o << "<line x1=\"" << num(ox + kLeft) << "\" y1=\"" << num(Y(y)) << "\" x2=\""
      << num(ox + kLeft + pw) << "\" y2=\"" << num(Y(y))
      << "\" stroke=\"#000\" stroke-dasharray=\"6,4\"/>\n";
    o << "<text x=\"" << num(ox + kLeft + pw - 4) << "\" y=\"" << num(Y(y) - 5)
      << "\" text-anchor=\"end\" font-size=\"11\">" << escape(text) << "</text>\n";
  }
}

// The y axis' top and tick step for data up to ymax.
std::pair<double, double> y_axis(double ymax) {
  if (ymax <= 0) ymax = 1;
  const double step = tick_step(ymax * 1.05);
  return {std::ceil(ymax * 1.05 / step) * step, step};
}

void bar_panel(std::ostringstream& o, const Panel& p, double ox) {
  const Bars& b = p.bars;
  double ymax = 0;
  for (std::size_t g = 0; g < b.groups.size(); ++g) {
    double sum = 0;
    for (const auto& stack : b.values) sum += g < stack.size() ? stack[g] : 0.0;
    ymax = std::max(ymax, sum);
  }
  for (const auto& h : p.hlines) ymax = std::max(ymax, h.first);
  const auto [ytop, step] = y_axis(ymax * 1.25);  // room for the legend above the bars
  o << "<g>\n";
  frame(o, p, ox, ytop, step);
  const double pw = kPanelW - kLeft - kRight, ph = kPanelH - kTop - kBottom;
  const double slot = pw / static_cast<double>(b.groups.size()), bw = slot * 0.6;
  for (std::size_t g = 0; g < b.groups.size(); ++g) {
    const double x = ox + kLeft + slot * (static_cast<double>(g) + 0.2);
    double base = 0;
    for (std::size_t s = 0; s < b.values.size(); ++s) {
      const double v = g < b.values[s].size() ? b.values[s][g] : 0.0;
      if (v <= 0) continue;
      const double y0 = kTop + ph - base / ytop * ph, y1 = kTop + ph - (base + v) / ytop * ph;
      o << "<rect x=\"" << num(x) << "\" y=\"" << num(y1) << "\" width=\"" << num(bw)
        << "\" height=\"" << num(y0 - y1) << "\" fill=\"" << kColors[s % std::size(kColors)]
        << "\"><title>" << escape(b.groups[g] + ": " + b.stacks[s] + " " + label(v))
        << "</title></rect>\n";
      base += v;
    }
    o << "<text x=\"" << num(x + bw / 2) << "\" y=\"" << num(kTop + ph - base / ytop * ph - 4)
      << "\" text-anchor=\"middle\" font-size=\"10\">" << num(base) << "</text>\n";
    o << "<text x=\"" << num(x + bw / 2) << "\" y=\"" << num(kTop + ph + 15)
      << "\" text-anchor=\"middle\" font-size=\"9\">" << escape(b.groups[g]) << "</text>\n";
  }
  for (std::size_t s = 0; s < b.stacks.size(); ++s)
    legend(o, ox, s, b.stacks[s], kColors[s % std::size(kColors)], true);
  o << "</g>\n";
}

void panel(std::ostringstream& o, const Panel& p, double ox) {
  if (!p.bars.groups.empty()) return bar_panel(o, p, ox);
  double xmin = INFINITY, xmax = -INFINITY, ymax = 0;
  for (const Series& s : p.series)
    for (auto [x, y] : s.points) {
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymax = std::max(ymax, y);
    }
  for (const auto& h : p.hlines) ymax = std::max(ymax, h.first);
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1;
  // Named variables, not a structured binding: the lambdas below capture ytop.
  const auto axis = y_axis(ymax);
  const double ytop = axis.first, step = axis.second;
  auto fx = [&](double x) { return p.log2_x ? std::log2(std::max(x, 1e-300)) : x; };
  const double x0 = fx(xmin), x1 = fx(xmax) > x0 ? fx(xmax) : x0 + 1;
  const double pw = kPanelW - kLeft - kRight, ph = kPanelH - kTop - kBottom;
  auto X = [&](double x) { return ox + kLeft + (fx(x) - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return kTop + ph - y / ytop * ph; };
  o << "<g>\n";
  frame(o, p, ox, ytop, step);
  std::vector<std::pair<double, std::string>> ticks = p.x_ticks;
  if (ticks.empty()) {
    std::set<double> xs;
    for (const Series& s : p.series)
      for (auto pt : s.points) xs.insert(pt.first);
    for (double x : xs) ticks.emplace_back(x, label(x));
  }
  for (const auto& [x, text] : ticks) {
    o << "<line x1=\"" << num(X(x)) << "\" y1=\"" << num(kTop + ph) << "\" x2=\"" << num(X(x))
      << "\" y2=\"" << num(kTop + ph + 4) << "\" stroke=\"#000\"/>\n";
    o << "<text x=\"" << num(X(x)) << "\" y=\"" << num(kTop + ph + 17)
      << "\" text-anchor=\"middle\" font-size=\"11\">" << escape(text) << "</text>\n";
  }
  for (std::size_t i = 0; i < p.series.size(); ++i) {
    const Series& s = p.series[i];
    const char* color = kColors[i % std::size(kColors)];
    if (s.markers_only) {
      for (auto [x, y] : s.points) {
        const double cx = X(x), cy = Y(y);
        o << "<path d=\"M" << num(cx) << "," << num(cy - 7) << " L" << num(cx + 7) << "," << num(cy)
          << " L" << num(cx) << "," << num(cy + 7) << " L" << num(cx - 7) << "," << num(cy)
          << " Z\" fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\"/>\n";
      }
    } else {
      o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
      for (auto [x, y] : s.points) o << num(X(x)) << "," << num(Y(y)) << " ";
      o << "\"/>\n";
      for (auto [x, y] : s.points)
        o << "<circle cx=\"" << num(X(x)) << "\" cy=\"" << num(Y(y)) << "\" r=\"3\" fill=\""
          << color << "\"/>\n";
    }
    legend(o, ox, i, s.name, color, false);
  }
  o << "</g>\n";
}

}  // namespace

std::string svg_chart(const std::string& title, const std::vector<Panel>& panels) {
  const double w = kPanelW * static_cast<double>(std::max<std::size_t>(panels.size(), 1));
  const double h = kPanelH + 30;
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(w) << "\" height=\"" << num(h)
    << "\" viewBox=\"0 0 " << num(w) << " " << num(h) << "\" font-family=\"sans-serif\">\n"
    << "<title>" << escape(title) << "</title>\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n"
    << "<g transform=\"translate(0,30)\">\n";
  for (std::size_t i = 0; i < panels.size(); ++i)
    panel(o, panels[i], kPanelW * static_cast<double>(i));
  o << "</g>\n<text x=\"" << num(w / 2) << "\" y=\"20\" text-anchor=\"middle\" font-size=\"16\" "
    << "font-weight=\"bold\">" << escape(title) << "</text>\n</svg>\n";
  return o.str();
}

void write_svg(const std::string& path, const std::string& title,
               const std::vector<Panel>& panels) {
  if (!mpi_job().prints()) return;  // under mpirun, process 0 writes the files
  write_file_atomically(path, svg_chart(title, panels));
}

}  // namespace tspemu::app
