#pragma once
/// @file svg.hpp
/// Line charts as plain SVG 1.1 text (no plotting library): stacked panels, each with axes,
/// "nice" ticks (1-2-5 steps), grid lines, a title and a legend. Deterministic output, so a
/// plot can be diffed and tested.

#include <string>
#include <utility>
#include <vector>

namespace pagedkv::sim {

/// One line of a panel.
struct SvgSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;  ///< (x, y), x ascending; non-finite y = gap
  bool dashed = false;
  bool markers = false;  ///< draw a small circle at every point
};

/// One chart panel.
struct SvgPanel {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<SvgSeries> series;
  bool y_from_zero = true;  ///< the y axis starts at 0 even if the data do not (x too)
  double y_max = 0;  ///< fixed upper bound when > 0 (e.g. 1 for a ratio); lines are clipped to it
  /// A bar chart instead of lines when non-empty: (category, value >= 0), drawn left to right
  /// in palette order, each labelled with its value; `series` and x_label are then ignored.
  std::vector<std::pair<std::string, double>> bars = {};
};

/// Renders panels stacked vertically into one SVG document, `width` pixels wide and
/// `panel_height` pixels per panel. Series colours come from a fixed 10-colour palette in series
/// order (bars too). Panels without data points are drawn with empty axes. Titles longer than the
/// plot width and legend labels longer than 32 characters are shortened with "...".
[[nodiscard]] std::string render_svg(const std::vector<SvgPanel>& panels, int width = 900,
                                     int panel_height = 360);

/// Writes `text` to `path`. Errors: throws pagedkv::Error "cannot write '<path>': <reason>".
void write_text_file(const std::string& path, const std::string& text);

}  // namespace pagedkv::sim
