#include "sim/svg.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/check.hpp"

namespace pagedkv::sim {

namespace {

// Tableau 10: distinguishable, colour-blind-friendly enough for 8-10 lines.
constexpr std::array<const char*, 10> kPalette = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                  "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                                                  "#9c755f", "#bab0ac"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

/// `s` cut to at most `max_chars` characters, ending in "..." when cut (ASCII text assumed).
std::string shorten(const std::string& s, size_t max_chars) {
  if (s.size() <= max_chars || max_chars < 4) return s;
  return s.substr(0, max_chars - 3) + "...";
}

/// Tick step of about `target` intervals over `span`: 1, 2 or 5 times a power of ten.
double nice_step(double span, int target) {
  if (!(span > 0)) return 1.0;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

/// Tick label: integers without decimals, large values with k/M/G suffixes.
std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-9) v = 0.0;  // accumulated rounding would print "-0"
  const double a = std::fabs(v);
  if (a >= 1e9 && step >= 1e8) return fmt::format("{:g}G", v / 1e9);
  if (a >= 1e6 && step >= 1e5) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e4 && step >= 1e3) return fmt::format("{:g}k", v / 1e3);
  if (step >= 1) return fmt::format("{:.0f}", v);
  const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step))), 1, 6);
  return fmt::format("{:.{}f}", v, decimals);
}

/// A bar panel (SvgPanel::bars): y from 0 to a nice bound, one bar per category.
void render_bars(std::string& out, const SvgPanel& p, int width, int top, int height) {
  const double left = 70, right = 250, pad_top = 30, pad_bottom = 45;
  const double x0 = left, x1 = width - right, y0 = top + height - pad_bottom, y1 = top + pad_top;
  double ymax = p.y_max;
  for (const auto& [label, v] : p.bars) {
    if (std::isfinite(v)) ymax = std::max(ymax, v);
  }
  if (!(ymax > 0)) ymax = 1;
  const double ystep = nice_step(ymax, 6);
  ymax = std::ceil(ymax / ystep - 1e-9) * ystep;
  auto sy = [&](double y) { return y0 - y / ymax * (y0 - y1); };
  out += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", x0,
      top + 20.0, escape(shorten(p.title, static_cast<size_t>((width - x0) / 8.5))));
  for (double y = 0; y <= ymax + ystep * 1e-6; y += ystep) {
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e0e0e0\"/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n",
        x0, sy(y), x1, sy(y), x0 - 6, sy(y) + 4, tick_label(y, ystep));
  }
  out += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#444\"/>\n<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" "
      "text-anchor=\"middle\" transform=\"rotate(-90 {:.1f} {:.1f})\">{}</text>\n",
      x0, y1, x1 - x0, y0 - y1, 18.0, (y0 + y1) / 2, 18.0, (y0 + y1) / 2, escape(p.y_label));
  const double slot = (x1 - x0) / static_cast<double>(std::max<size_t>(1, p.bars.size()));
  for (size_t i = 0; i < p.bars.size(); ++i) {
    const auto& [label, v] = p.bars[i];
    const double value = std::isfinite(v) ? std::max(0.0, v) : 0.0;
    const double cx = x0 + slot * (static_cast<double>(i) + 0.5);
    const double w = slot * 0.6;
    out += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
        "<title>{}: {:g}</title></rect>\n",
        cx - w / 2, sy(value), w, y0 - sy(value), kPalette[i % kPalette.size()], escape(label),
        value);
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\">{:.3g}</text>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
        cx, sy(value) - 4, value, cx, y0 + 16, escape(shorten(label, 20)));
  }
}

void render_panel(std::string& out, const SvgPanel& p, int width, int top, int height) {
  if (!p.bars.empty()) {
    render_bars(out, p, width, top, height);
    return;
  }
  const double left = 70, right = 250, pad_top = 30, pad_bottom = 45;
  const double x0 = left, x1 = width - right, y0 = top + height - pad_bottom, y1 = top + pad_top;

  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin;
  double ymin = xmin, ymax = -xmin;
  for (const SvgSeries& s : p.series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymin = std::min(ymin, y);
      ymax = std::max(ymax, y);
    }
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  if (p.y_from_zero) {
    ymin = std::min(ymin, 0.0);
    xmin = std::min(xmin, 0.0);
  }
  if (p.y_max > 0) ymax = p.y_max;
  if (xmax <= xmin) xmax = xmin + 1;
  if (ymax <= ymin) ymax = ymin + 1;
  const double xstep = nice_step(xmax - xmin, 8);
  const double ystep = nice_step(ymax - ymin, 6);
  if (p.y_max <= 0) ymax = std::ceil(ymax / ystep - 1e-9) * ystep;
  ymin = std::floor(ymin / ystep + 1e-9) * ystep;
  auto sx = [&](double x) { return x0 + (x - xmin) / (xmax - xmin) * (x1 - x0); };
  auto sy = [&](double y) { return y0 - (y - ymin) / (ymax - ymin) * (y0 - y1); };

  out += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"15\" font-weight=\"bold\">{}"
      "</text>\n",
      x0, top + 20.0, escape(shorten(p.title, static_cast<size_t>((width - x0) / 8.5))));
  // Grid and ticks.
  for (double y = ymin; y <= ymax + ystep * 1e-6; y += ystep) {
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"#e0e0e0\"/>\n",
        x0, sy(y), x1, sy(y));
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}"
        "</text>\n",
        x0 - 6, sy(y) + 4, tick_label(y, ystep));
  }
  for (double x = std::ceil(xmin / xstep - 1e-9) * xstep; x <= xmax + xstep * 1e-6; x += xstep) {
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"#f0f0f0\"/>\n",
        sx(x), y0, sx(x), y1);
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" "
        "text-anchor=\"middle\">{}</text>\n",
        sx(x), y0 + 16, tick_label(x, xstep));
  }
  out += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
      "fill=\"none\" stroke=\"#444\"/>\n",
      x0, y1, x1 - x0, y0 - y1);
  out += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\">{}"
      "</text>\n",
      (x0 + x1) / 2, y0 + 36, escape(p.x_label));
  out += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 {:.1f} {:.1f})\">{}</text>\n",
      18.0, (y0 + y1) / 2, 18.0, (y0 + y1) / 2, escape(p.y_label));

  // Lines (a non-finite y breaks the line), clipped to the plot area, then the legend.
  const std::string clip = fmt::format("clip{}", top);
  out += fmt::format(
      "<clipPath id=\"{}\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
      "height=\"{:.1f}\"/></clipPath>\n",
      clip, x0, y1, x1 - x0, y0 - y1);
  for (size_t i = 0; i < p.series.size(); ++i) {
    const SvgSeries& s = p.series[i];
    const char* colour = kPalette[i % kPalette.size()];
    std::string path;
    bool pen_down = false;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) {
        pen_down = false;
        continue;
      }
      path += fmt::format("{}{:.1f},{:.1f}", pen_down ? " L" : (path.empty() ? "M" : " M"), sx(x),
                          sy(y));
      pen_down = true;
    }
    if (!path.empty()) {
      out += fmt::format(
          "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\"{} "
          "clip-path=\"url(#{})\"><title>{}</title></path>\n",
          path, colour, s.dashed ? " stroke-dasharray=\"6 4\"" : "", clip, escape(s.label));
    }
    if (s.markers) {
      for (const auto& [x, y] : s.points) {
        if (!std::isfinite(x) || !std::isfinite(y) || sy(y) < y1 - 0.5) continue;
        out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", sx(x),
                           sy(y), colour);
      }
    }
    const double ly = y1 + 8 + 18.0 * static_cast<double>(i);
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"{}\" stroke-width=\"2.5\"{}/>\n",
        x1 + 12, ly, x1 + 36, ly, colour, s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\">{}</text>\n", x1 + 42,
                       ly + 4, escape(shorten(s.label, 32)));
  }
}

}  // namespace

std::string render_svg(const std::vector<SvgPanel>& panels, int width, int panel_height) {
  const int height = panel_height * std::max<int>(1, static_cast<int>(panels.size()));
  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
  for (size_t i = 0; i < panels.size(); ++i) {
    render_panel(out, panels[i], width, static_cast<int>(i) * panel_height, panel_height);
  }
  out += "</svg>\n";
  return out;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  f << text;
  f.flush();
  if (!f) throw Error(fmt::format("cannot write '{}': write failed", path));
}

}  // namespace pagedkv::sim
