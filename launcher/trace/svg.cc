// Schedule pictures and line plots as SVG text (launcher/trace/svg.h).
#include "launcher/trace/svg.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace troupe::launcher::trace {
namespace {

// Megatron's figures: forward passes blue, backward passes green; the
// interleaved schedule's chunks are lighter shades of the same two. A
// zero-bubble schedule's W is orange.
struct Rgb {
  int r, g, b;
};
constexpr Rgb kForward{47, 98, 178};
constexpr Rgb kBackward{84, 160, 72};
constexpr Rgb kWeight{224, 138, 30};

Rgb shade(Pass p, int chunk, int chunks) {
  const Rgb base = p == Pass::kForward ? kForward : p == Pass::kBackward ? kBackward : kWeight;
  // chunk 0 the full color, the last about halfway to white
  const double f = chunks > 1 ? 0.55 * chunk / (chunks - 1) : 0.0;
  auto mix = [f](int c) { return static_cast<int>(std::lround(c + (255 - c) * f)); };
  return {mix(base.r), mix(base.g), mix(base.b)};
}

std::string css(Rgb c) { return absl::StrFormat("#%02x%02x%02x", c.r, c.g, c.b); }
bool dark(Rgb c) { return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b < 150; }

std::string fmt(double v) {
  std::string s = absl::StrFormat("%.6g", v);
  return s;
}

// The width of a character of 12 px sans-serif, about (no font metrics
// here): enough that legend entries and row labels do not overlap.
constexpr double kCharW = 7.0;

// The geometry of a schedule picture.
struct Frame {
  double left = 60, top = 56, row_h = 30, gap = 6, right = 24;
  double t0 = 0, t1 = 1, width = 0;
  double x(double t) const { return left + (t - t0) / (t1 - t0) * (width - left - right); }
  double y(int row) const { return top + row * (row_h + gap); }
};

void legend(const ScheduleSvg& s, const Frame& f, std::string* out) {
  double x = f.left;
  const double y = 30;
  auto swatch = [&](Rgb c, const std::string& text) {
    absl::StrAppend(
        out, absl::StrFormat("<rect x=\"%s\" y=\"%s\" width=\"16\" height=\"14\" fill=\"%s\" "
                             "stroke=\"#333\" stroke-width=\"0.5\"/><text x=\"%s\" y=\"%s\" "
                             "font-size=\"12\">%s</text>\n",
                             fmt(x), fmt(y - 11), css(c), fmt(x + 20), fmt(y), xml_escape(text)));
    x += 32 + kCharW * static_cast<double>(text.size());
  };
  for (int c = 0; c < s.chunks; c++) {
    swatch(shade(Pass::kForward, c, s.chunks),
           s.chunks > 1 ? absl::StrCat("forward, chunk ", c) : "forward");
  }
  const bool split = std::any_of(s.blocks.begin(), s.blocks.end(),
                                 [](const Block& b) { return b.pass == Pass::kWeight; });
  const std::string backward = split ? "B" : "backward";
  for (int c = 0; c < s.chunks; c++) {
    swatch(shade(Pass::kBackward, c, s.chunks),
           s.chunks > 1 ? absl::StrCat(backward, ", chunk ", c) : backward);
  }
  if (split) {
    for (int c = 0; c < s.chunks; c++) {
      swatch(shade(Pass::kWeight, c, s.chunks), s.chunks > 1 ? absl::StrCat("W, chunk ", c) : "W");
    }
  }
  swatch({255, 255, 255}, "idle");
  if (!s.arrows.empty()) {
    absl::StrAppend(out, absl::StrFormat("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" "
                                         "stroke=\"#c0392b\" stroke-width=\"1.2\" "
                                         "marker-end=\"url(#arrow)\"/>",
                                         fmt(x), fmt(y - 4), fmt(x + 24), fmt(y - 4)));
    const std::string text = "message (send posted -> received)";
    absl::StrAppend(out, absl::StrFormat("<text x=\"%s\" y=\"%s\" font-size=\"12\">%s</text>\n",
                                         fmt(x + 30), fmt(y), xml_escape(text)));
    x += 44 + kCharW * static_cast<double>(text.size());
  }
  if (!s.label_note.empty()) {
    // After the legend while it fits, else on the title's line (after it).
    const double w = kCharW * static_cast<double>(s.label_note.size());
    const bool fits = x + w <= f.width - f.right;
    const double nx = fits ? x : f.left + 9.0 * static_cast<double>(s.title.size()) + 24;
    absl::StrAppend(
        out, absl::StrFormat("<text x=\"%s\" y=\"%s\" font-size=\"12\" fill=\"#555\">%s</text>\n",
                             fmt(nx), fmt(fits ? y : 16), xml_escape(s.label_note)));
  }
}

void time_axis(const ScheduleSvg& s, const Frame& f, double y, std::string* out) {
  absl::StrAppend(
      out, absl::StrFormat("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#333\"/>\n",
                           fmt(f.x(f.t0)), fmt(y), fmt(f.x(f.t1)), fmt(y)));
  for (double t : nice_ticks(f.t0, f.t1, 10)) {
    absl::StrAppend(
        out, absl::StrFormat(
                 "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#333\"/>"
                 "<text x=\"%s\" y=\"%s\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                 fmt(f.x(t)), fmt(y), fmt(f.x(t)), fmt(y + 5), fmt(f.x(t)), fmt(y + 18), fmt(t)));
  }
  absl::StrAppend(
      out, absl::StrFormat("<text x=\"%s\" y=\"%s\" font-size=\"12\" "
                           "text-anchor=\"middle\">time (%s)</text>\n",
                           fmt((f.x(f.t0) + f.x(f.t1)) / 2), fmt(y + 34), xml_escape(s.unit)));
}

void block(const Block& b, const ScheduleSvg& s, const Frame& f, std::string* out) {
  const Rgb c = shade(b.pass, b.chunk, s.chunks);
  const double x0 = f.x(b.begin), x1 = f.x(b.end), y = f.y(b.row);
  const double w = std::max(x1 - x0, 0.5);
  absl::StrAppend(
      out, absl::StrFormat("<g><title>%s</title><rect x=\"%s\" y=\"%s\" width=\"%s\" "
                           "height=\"%s\" fill=\"%s\" stroke=\"#222\" "
                           "stroke-width=\"0.6\"/>",
                           xml_escape(b.tooltip), fmt(x0), fmt(y), fmt(w), fmt(f.row_h), css(c)));
  // The label when it fits: about 7 px per digit at 12 px.
  const double size = std::min(13.0, f.row_h * 0.5);
  if (!b.label.empty() && w >= 0.62 * size * static_cast<double>(b.label.size()) + 2) {
    absl::StrAppend(out,
                    absl::StrFormat("<text x=\"%s\" y=\"%s\" font-size=\"%s\" "
                                    "text-anchor=\"middle\" fill=\"%s\">%s</text>",
                                    fmt(x0 + w / 2), fmt(y + f.row_h / 2 + size * 0.36), fmt(size),
                                    dark(c) ? "#fff" : "#000", xml_escape(b.label)));
  }
  absl::StrAppend(out, "</g>\n");
}

// A plot's drawing area and its data ranges.
struct PlotFrame {
  double left = 64, right = 16, top = 30, bottom = 46, w = 0, h = 0;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  double X(double v) const { return left + (v - x0) / (x1 - x0) * (w - left - right); }
  double Y(double v) const { return h - bottom - (v - y0) / (y1 - y0) * (h - top - bottom); }
};

// Both axes with their ticks, the grid and the labels.
void plot_axes(const Plot& p, const PlotFrame& f, std::string* out) {
  const double base = f.h - f.bottom;
  absl::StrAppend(
      out, absl::StrFormat("<path d=\"M%s,%s L%s,%s L%s,%s\" fill=\"none\" stroke=\"#333\"/>\n",
                           fmt(f.left), fmt(f.top), fmt(f.left), fmt(base), fmt(f.w - f.right),
                           fmt(base)));
  for (double t : nice_ticks(f.x0, f.x1, 6)) {
    absl::StrAppend(
        out, absl::StrFormat(
                 "<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#333\"/>"
                 "<text x=\"%s\" y=\"%s\" font-size=\"10\" text-anchor=\"middle\">%s</text>\n",
                 fmt(f.X(t)), fmt(base), fmt(f.X(t)), fmt(base + 4), fmt(f.X(t)), fmt(base + 16),
                 fmt(t)));
  }
  for (double t : nice_ticks(f.y0, f.y1, 5)) {
    absl::StrAppend(
        out,
        absl::StrFormat("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#ddd\"/>"
                        "<text x=\"%s\" y=\"%s\" font-size=\"10\" text-anchor=\"end\">%s</text>\n",
                        fmt(f.left), fmt(f.Y(t)), fmt(f.w - f.right), fmt(f.Y(t)), fmt(f.left - 4),
                        fmt(f.Y(t) + 3), fmt(t)));
  }
  const double mid_y = (f.top + base) / 2;
  absl::StrAppend(
      out,
      absl::StrFormat("<text x=\"%s\" y=\"%s\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n"
                      "<text x=\"12\" y=\"%s\" font-size=\"11\" text-anchor=\"middle\" "
                      "transform=\"rotate(-90 12 %s)\">%s</text>\n",
                      fmt((f.left + f.w - f.right) / 2), fmt(f.h - 8), xml_escape(p.x_label),
                      fmt(mid_y), fmt(mid_y), xml_escape(p.y_label)));
}

}  // namespace

std::string xml_escape(const std::string& s) {
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
        out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int want) {
  std::vector<double> out;
  if (!(hi > lo) || want < 1) return {lo};
  const double raw = (hi - lo) / want;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step) {
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return out;
}

std::string render_schedule_svg(const ScheduleSvg& s) {
  Frame f;
  f.width = s.width;
  for (const std::string& r : s.rows)
    f.left = std::max(f.left, 20 + kCharW * static_cast<double>(r.size()));
  f.t0 = 0;
  f.t1 = 0;
  bool first = true;
  for (const Block& b : s.blocks) {
    f.t0 = first ? b.begin : std::min(f.t0, b.begin);
    f.t1 = first ? b.end : std::max(f.t1, b.end);
    first = false;
  }
  for (const Arrow& a : s.arrows) f.t1 = std::max(f.t1, a.to);
  if (!(f.t1 > f.t0)) f.t1 = f.t0 + 1;
  const double axis_y = f.y(static_cast<int>(s.rows.size())) + 4;
  const double height = axis_y + 46;
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%s\" viewBox=\"0 0 %d %s\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
      "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"6\" "
      "markerHeight=\"6\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" "
      "fill=\"#c0392b\"/></marker></defs>\n",
      s.width, fmt(height), s.width, fmt(height));
  absl::StrAppend(&out, absl::StrFormat("<text x=\"%s\" y=\"16\" font-size=\"14\" "
                                        "font-weight=\"bold\">%s</text>\n",
                                        fmt(f.left), xml_escape(s.title)));
  legend(s, f, &out);
  for (std::size_t r = 0; r < s.rows.size(); r++) {
    const double y = f.y(static_cast<int>(r));
    // The row's lane: a thin frame, so idle time reads as white gaps.
    absl::StrAppend(
        &out, absl::StrFormat("<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"#fff\" "
                              "stroke=\"#bbb\" stroke-width=\"0.6\"/><text x=\"%s\" y=\"%s\" "
                              "font-size=\"12\" text-anchor=\"end\">%s</text>\n",
                              fmt(f.x(f.t0)), fmt(y), fmt(f.x(f.t1) - f.x(f.t0)), fmt(f.row_h),
                              fmt(f.left - 8), fmt(y + f.row_h / 2 + 4), xml_escape(s.rows[r])));
  }
  for (const Block& b : s.blocks) block(b, s, f, &out);
  for (const Arrow& a : s.arrows) {
    const double y0 = f.y(a.from_row) + (a.to_row > a.from_row ? f.row_h : 0);
    const double y1 = f.y(a.to_row) + (a.to_row > a.from_row ? 0 : f.row_h);
    absl::StrAppend(&out, absl::StrFormat("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" "
                                          "stroke=\"#c0392b\" stroke-width=\"1\" "
                                          "marker-end=\"url(#arrow)\"/>\n",
                                          fmt(f.x(a.from)), fmt(y0), fmt(f.x(a.to)), fmt(y1)));
  }
  time_axis(s, f, axis_y, &out);
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

std::string render_plot_svg(const Plot& p) {
  PlotFrame f;
  f.w = p.width;
  f.h = p.height;
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "font-family=\"sans-serif\"><rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
      "<text x=\"%s\" y=\"18\" font-size=\"14\" font-weight=\"bold\" "
      "text-anchor=\"middle\">%s</text>\n",
      p.width, p.height, p.width, p.height, fmt(f.w / 2), xml_escape(p.title));
  const std::size_t n = std::min(p.x.size(), p.y.size());
  if (n == 0) {
    absl::StrAppend(&out, absl::StrFormat("<text x=\"%s\" y=\"%s\" font-size=\"12\" "
                                          "text-anchor=\"middle\">no data</text></svg>\n",
                                          fmt(f.w / 2), fmt(f.h / 2)));
    return out;
  }
  f.x0 = *std::min_element(p.x.begin(), p.x.begin() + n);
  f.x1 = *std::max_element(p.x.begin(), p.x.begin() + n);
  f.y0 = *std::min_element(p.y.begin(), p.y.begin() + n);
  f.y1 = *std::max_element(p.y.begin(), p.y.begin() + n);
  if (!(f.x1 > f.x0)) f.x1 = f.x0 + 1;
  if (!(f.y1 > f.y0)) {  // a constant: a band around it
    const double pad = f.y0 != 0 ? std::abs(f.y0) * 0.05 : 1;
    f.y0 -= pad;
    f.y1 += pad;
  }
  plot_axes(p, f, &out);
  std::string d;
  for (std::size_t i = 0; i < n; i++) {
    absl::StrAppend(&d, i == 0 ? "M" : " L", fmt(f.X(p.x[i])), ",", fmt(f.Y(p.y[i])));
  }
  absl::StrAppend(&out, "<path d=\"", d,
                  "\" fill=\"none\" stroke=\"#2f62b2\" stroke-width=\"1.5\"/>\n");
  if (n <= 60) {  // points with their values as tooltips, while they stay apart
    for (std::size_t i = 0; i < n; i++) {
      absl::StrAppend(
          &out, absl::StrFormat("<circle cx=\"%s\" cy=\"%s\" r=\"2.2\" fill=\"#2f62b2\">"
                                "<title>%s: %s</title></circle>\n",
                                fmt(f.X(p.x[i])), fmt(f.Y(p.y[i])), fmt(p.x[i]), fmt(p.y[i])));
    }
  }
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

}  // namespace troupe::launcher::trace
