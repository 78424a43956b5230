#include "mindspeed_mm/tools/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#ifndef MM_NO_CAIRO
#include <cairo-svg.h>
#include <cairo.h>
#endif

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/data/tokenizer/precompiled_charsmap.h"  // encode_base64

namespace fs = std::filesystem;

namespace mm::tools {

std::string run_info_path(const std::string& metrics_path) {
  const fs::path p(metrics_path);
  if (p.filename() == "metrics.jsonl") return (p.parent_path() / "run_info.json").string();
  return (p.parent_path() / (p.stem().string() + ".run_info.json")).string();
}

RunRecord load_run(const std::string& path) {
  RunRecord r;
  r.path = path;
  std::string metrics = path;
  fs::path info;
  if (fs::is_directory(path)) {
    metrics = (fs::path(path) / "metrics.jsonl").string();
    info = run_info_path(metrics);
    r.name = fs::path(path).filename().string();
    if (r.name.empty()) r.name = fs::path(path).parent_path().filename().string();
  } else {
    info = run_info_path(path);
    r.name = fs::path(path).stem().string();
  }
  const auto bytes = read_file_bytes(metrics);
  if (!bytes)
    throw Error(cat(metrics, ": ", fs::exists(metrics) ? unreadable_reason(metrics) : "no metrics file",
                    " (a run's save_dir holds metrics.jsonl)"));
  std::istringstream in(*bytes);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw Error(cat(metrics, ":", n, ": not a JSON record"));
    }
    if (!j.is_object() || !j.contains("iter") || !j["iter"].is_number()) continue;
    const double it = j["iter"].get<double>();
    for (const auto& [key, value] : j.items())
      if (key != "iter" && value.is_number() && std::isfinite(value.get<double>())) r.series[key].emplace_back(it, value.get<double>());
  }
  if (r.series.empty()) throw Error(cat(metrics, ": no training records (lines with \"iter\")"));
  std::optional<std::string> text = read_file_bytes(info.string());
  if (!text && fs::exists(info)) throw Error(cat(info.string(), ": ", unreadable_reason(info.string())));
  if (text) {
    try {
      const nlohmann::json j = nlohmann::json::parse(*text);
      r.config_yaml = j.value("config_yaml", std::string());
      if (j.contains("environment") && j["environment"].is_object()) r.environment = j["environment"];
    } catch (const nlohmann::json::exception&) {
      throw Error(cat(info.string(), ": not JSON"));
    }
  }
  return r;
}

std::vector<std::pair<double, double>> smooth(const std::vector<std::pair<double, double>>& points, double weight) {
  std::vector<std::pair<double, double>> out;
  double last = 0;
  int64_t n = 0;
  for (const auto& [x, y] : points) {
    last = last * weight + (1 - weight) * y;
    ++n;
    out.emplace_back(x, last / (1 - std::pow(weight, static_cast<double>(n))));  // debiased, as TensorBoard
  }
  return out;
}

namespace {

struct Rgb {
  double r, g, b;
};
// matplotlib's tab10: run k draws in colour k.
const Rgb kPalette[] = {{0.122, 0.467, 0.706}, {0.839, 0.153, 0.157}, {0.173, 0.627, 0.173}, {1.000, 0.498, 0.055},
                        {0.580, 0.404, 0.741}, {0.549, 0.337, 0.294}, {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498}};
Rgb colour(size_t k) { return kPalette[k % (sizeof(kPalette) / sizeof(kPalette[0]))]; }
std::string hex(const Rgb& c) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", static_cast<int>(std::lround(c.r * 255)),
                static_cast<int>(std::lround(c.g * 255)), static_cast<int>(std::lround(c.b * 255)));
  return buf;
}

struct Line {
  std::vector<std::pair<double, double>> points;
  Rgb colour;
  double alpha = 1, width = 1.8;
  bool markers = false;  // validation: a dot per point, joined
};

struct Plot {
  std::string name, title, y_label;
  std::vector<Line> lines;
};

// What each plot draws, from the records' keys: (key, scale) per run.
struct PlotSpec {
  std::string name, title, y_label, key;
  double scale = 1;
};

std::vector<Plot> make_plots(const std::vector<RunRecord>& runs, double smoothing) {
  std::vector<Plot> plots;
  auto has = [&](const std::string& key) {
    for (const auto& r : runs)
      if (r.series.count(key) && !r.series.at(key).empty()) return true;
    return false;
  };
  if (has("loss") || has("val_loss")) {
    Plot p{"loss", cat("loss (smoothed ", smoothing, "; validation as dots)"), "loss", {}};
    for (size_t k = 0; k < runs.size(); ++k) {
      if (runs[k].series.count("loss")) {
        const auto& raw = runs[k].series.at("loss");
        p.lines.push_back({raw, colour(k), 0.25, 1.0, false});
        p.lines.push_back({smooth(raw, smoothing), colour(k), 1, 2.0, false});
      }
      if (runs[k].series.count("val_loss")) p.lines.push_back({runs[k].series.at("val_loss"), colour(k), 1, 1.2, true});
    }
    plots.push_back(std::move(p));
  }
  const PlotSpec specs[] = {
      {"lr", "learning rate", "lr", "lr", 1},
      {"grad_norm", "gradient norm (before clipping)", "norm", "grad_norm", 1},
      {"throughput", "throughput", "tokens / s", "tokens_per_s", 1},
      {"mfu", "model FLOPs utilisation", "MFU %", "mfu", 100},
      {"step_time", "step time", "ms", "step_time_s", 1000},
      {"memory", "peak live tensors per step", "MiB", "mem_peak_bytes", 1.0 / 1048576},
      {"memory_reserved", "peak process memory per step (CUDA: reserved; CPU: resident set)", "MiB",
       "mem_peak_reserved_bytes", 1.0 / 1048576},
  };
  for (const PlotSpec& s : specs) {
    if (!has(s.key)) continue;
    Plot p{s.name, s.title, s.y_label, {}};
    for (size_t k = 0; k < runs.size(); ++k) {
      if (!runs[k].series.count(s.key)) continue;
      std::vector<std::pair<double, double>> pts = runs[k].series.at(s.key);
      for (auto& [x, y] : pts) y *= s.scale;
      p.lines.push_back({std::move(pts), colour(k), 1, 1.6, false});
    }
    plots.push_back(std::move(p));
  }
  // Each validation metric but the loss (perplexity, PSNR, ...).
  std::set<std::string> val_keys;
  for (const auto& r : runs)
    for (const auto& [key, pts] : r.series)
      if (key.rfind("val_", 0) == 0 && key != "val_loss" && !pts.empty()) val_keys.insert(key);
  for (const std::string& key : val_keys) {
    Plot p{key, "validation " + key.substr(4), key.substr(4), {}};
    for (size_t k = 0; k < runs.size(); ++k)
      if (runs[k].series.count(key)) p.lines.push_back({runs[k].series.at(key), colour(k), 1, 1.4, true});
    plots.push_back(std::move(p));
  }
  return plots;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// "1.2k", "3e-04", "0.25": short tick labels.
std::string tick_label(double v, double step) {
  char buf[32];
  const double a = std::abs(v);
  if (a == 0) return "0";
  if (a >= 1e5 || a < 1e-3) std::snprintf(buf, sizeof(buf), "%.1e", v);
  else {
    int digits = 0;  // enough for every tick: 0.0025 steps need 4
    while (digits < 8 && std::abs(step * std::pow(10, digits) - std::round(step * std::pow(10, digits))) > 1e-6) ++digits;
    std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  }
  return buf;
}

double nice_step(double range, int target) {
  const double raw = range / std::max(1, target);
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

#ifndef MM_NO_CAIRO
void draw(cairo_t* cr, const Plot& p, int w, int h) {
  const double left = 70, right = 16, top = 34, bottom = 44;
  const double pw = w - left - right, ph = h - top - bottom;
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Line& l : p.lines)
    for (const auto& [x, y] : l.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x0 -= 0.5, x1 += 0.5;
  if (y1 == y0) {
    const double d = y0 == 0 ? 1 : std::abs(y0) * 0.1;
    y0 -= d, y1 += d;
  }
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * ph; };

  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  // Grid and tick labels.
  cairo_set_font_size(cr, 11);
  cairo_set_line_width(cr, 1);
  const double ys = nice_step(y1 - y0, 5), xs = nice_step(x1 - x0, 6);
  for (double v = std::ceil(y0 / ys) * ys; v <= y1 + 1e-12 * std::abs(y1); v += ys) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, left, std::round(Y(v)) + 0.5);
    cairo_line_to(cr, left + pw, std::round(Y(v)) + 0.5);
    cairo_stroke(cr);
    const std::string t = tick_label(v, ys);
    cairo_text_extents_t e;
    cairo_text_extents(cr, t.c_str(), &e);
    cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
    cairo_move_to(cr, left - 6 - e.x_advance, Y(v) + 4);
    cairo_show_text(cr, t.c_str());
  }
  for (double v = std::ceil(x0 / xs) * xs; v <= x1 + 1e-12 * std::abs(x1); v += xs) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, std::round(X(v)) + 0.5, top);
    cairo_line_to(cr, std::round(X(v)) + 0.5, top + ph);
    cairo_stroke(cr);
    const std::string t = tick_label(v, xs);
    cairo_text_extents_t e;
    cairo_text_extents(cr, t.c_str(), &e);
    cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
    cairo_move_to(cr, X(v) - e.x_advance / 2, top + ph + 16);
    cairo_show_text(cr, t.c_str());
  }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_rectangle(cr, left + 0.5, top + 0.5, pw, ph);
  cairo_stroke(cr);
  // Title, axis names.
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  cairo_set_font_size(cr, 14);
  cairo_move_to(cr, left, 22);
  cairo_show_text(cr, p.title.c_str());
  cairo_set_font_size(cr, 11);
  cairo_move_to(cr, left + pw / 2 - 20, h - 10);
  cairo_show_text(cr, "iteration");
  cairo_save(cr);
  cairo_move_to(cr, 16, top + ph / 2 + 20);
  cairo_rotate(cr, -M_PI / 2);
  cairo_show_text(cr, p.y_label.c_str());
  cairo_restore(cr);
  // The lines, clipped to the plot area.
  cairo_save(cr);
  cairo_rectangle(cr, left, top, pw, ph);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  for (const Line& l : p.lines) {
    if (l.points.empty()) continue;
    cairo_set_source_rgba(cr, l.colour.r, l.colour.g, l.colour.b, l.alpha);
    cairo_set_line_width(cr, l.width);
    cairo_move_to(cr, X(l.points[0].first), Y(l.points[0].second));
    for (size_t i = 1; i < l.points.size(); ++i) cairo_line_to(cr, X(l.points[i].first), Y(l.points[i].second));
    cairo_stroke(cr);
    if (l.markers)
      for (const auto& [x, y] : l.points) {
        cairo_arc(cr, X(x), Y(y), 3.2, 0, 2 * M_PI);
        cairo_fill(cr);
      }
  }
  cairo_restore(cr);
}

cairo_status_t append(void* closure, const unsigned char* data, unsigned int n) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), n);
  return CAIRO_STATUS_SUCCESS;
}
#endif

}  // namespace

ReportSummary write_report(const std::vector<RunRecord>& runs, const std::string& out_html, const ReportOptions& o) {
#ifdef MM_NO_CAIRO
  (void)runs, (void)o;
  throw Error(cat(out_html, ": this mm was built without cairo (MM_WITH_CAIRO=OFF): mm report cannot draw"));
#else
  if (runs.empty()) throw Error("report: no run to report");
  ReportSummary summary;
  const std::vector<Plot> plots = make_plots(runs, o.smoothing);
  std::string stem = out_html;
  if (stem.size() > 5 && stem.substr(stem.size() - 5) == ".html") stem.resize(stem.size() - 5);
  const fs::path png_dir = stem + "_plots";
  std::error_code ec;
  fs::create_directories(png_dir, ec);
  if (ec) throw Error(cat(png_dir.string(), ": cannot create the plots' folder (", ec.message(), ")"));

  std::string figures;
  for (const Plot& p : plots) {
    std::string svg;
    {
      cairo_surface_t* s = cairo_svg_surface_create_for_stream(append, &svg, o.width, o.height);
      cairo_t* cr = cairo_create(s);
      draw(cr, p, o.width, o.height);
      cairo_destroy(cr);
      cairo_surface_finish(s);
      cairo_surface_destroy(s);
    }
    const std::string png = (png_dir / (p.name + ".png")).string();
    {
      cairo_surface_t* s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, o.width, o.height);
      cairo_t* cr = cairo_create(s);
      draw(cr, p, o.width, o.height);
      cairo_destroy(cr);
      const cairo_status_t st = cairo_surface_write_to_png(s, png.c_str());
      cairo_surface_destroy(s);
      if (st != CAIRO_STATUS_SUCCESS) throw Error(cat(png, ": cannot write the PNG (", cairo_status_to_string(st), ")"));
    }
    summary.plots.push_back(p.name);
    summary.pngs.push_back(png);
    figures += cat("<figure id=\"plot-", p.name, "\"><img alt=\"", html_escape(p.title), "\" width=\"", o.width,
                   "\" height=\"", o.height, "\" src=\"data:image/svg+xml;base64,", data::encode_base64(svg), "\"></figure>\n");
  }

  std::string legend, configs, envs, table;
  for (size_t k = 0; k < runs.size(); ++k) {
    const RunRecord& r = runs[k];
    legend += cat("<li><span class=\"swatch\" style=\"background:", hex(colour(k)), "\"></span>", html_escape(r.name),
                  " <small>", html_escape(r.path), "</small></li>\n");
    auto last = [&](const std::string& key) -> std::string {
      if (!r.series.count(key) || r.series.at(key).empty()) return "";
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.4g", r.series.at(key).back().second);
      return buf;
    };
    const std::string steps = r.series.count("loss") ? std::to_string(r.series.at("loss").size()) : "0";
    table += cat("<tr><td>", html_escape(r.name), "</td><td>", steps, "</td><td>", last("loss"), "</td><td>",
                 last("val_loss"), "</td><td>", last("tokens_per_s"), "</td></tr>\n");
    configs += cat("<details", k == 0 ? " open" : "", "><summary>", html_escape(r.name), "</summary><pre>",
                   html_escape(r.config_yaml.empty() ? "(no run_info.json beside the metrics)" : r.config_yaml),
                   "</pre></details>\n");
    envs += cat("<h3>", html_escape(r.name), "</h3><table>");
    for (const auto& [key, value] : r.environment.items())
      envs += cat("<tr><th>", html_escape(key), "</th><td>",
                  html_escape(value.is_string() ? value.get<std::string>() : value.dump()), "</td></tr>");
    envs += "</table>\n";
  }

  const std::string page = cat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>mm report: ", html_escape(runs[0].name),
      runs.size() > 1 ? cat(" and ", runs.size() - 1, " more") : std::string(), "</title>\n<style>\n",
      "body{font-family:sans-serif;margin:24px;color:#222;max-width:1340px}\n",
      ".plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(", o.width * 3 / 4, "px,1fr));gap:12px}\n",
      "figure{margin:0;border:1px solid #ddd}figure img{display:block;max-width:100%;height:auto}\n",
      ".swatch{display:inline-block;width:14px;height:14px;margin-right:6px;vertical-align:middle}\n",
      "ul.runs{list-style:none;padding:0}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px;",
      "text-align:left}pre{background:#f6f6f6;padding:8px;overflow:auto}\n</style>\n",
      "<script>window.mmErrors=[];window.addEventListener('error',function(e){window.mmErrors.push(String(e.message));",
      "});document.addEventListener('DOMContentLoaded',function(){var n=document.querySelectorAll('figure img').length;",
      "document.getElementById('status').textContent='loaded '+n+' plots, errors: '+window.mmErrors.length;});</script>\n",
      "</head><body>\n<h1>Training report</h1>\n<p id=\"status\">loading</p>\n<ul class=\"runs\">\n", legend,
      "</ul>\n<table><tr><th>run</th><th>steps</th><th>last loss</th><th>last validation loss</th>",
      "<th>last tokens/s</th></tr>\n", table, "</table>\n<h2>Plots</h2>\n<div class=\"plots\">\n", figures,
      "</div>\n<h2>Resolved config</h2>\n", configs, "<h2>Environment</h2>\n", envs,
      "<p><small>PNG copies of the plots: ", html_escape(png_dir.string()), "/</small></p>\n</body></html>\n");
  st::write_file_atomic(out_html, page);
  return summary;
#endif
}

}  // namespace mm::tools
