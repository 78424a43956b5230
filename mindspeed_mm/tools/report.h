// `mm report RUN_DIR [--compare RUN_DIR ...] --out report.html`: one self-contained HTML page of
// a training run (several overlaid), from what the run wrote: RUN_DIR/metrics.jsonl (every step
// and event record) and RUN_DIR/run_info.json (the resolved config and the environment). Plots:
// loss (raw and smoothed, validation as points), learning rate, gradient norm, throughput, MFU,
// memory, and each validation metric; drawn with cairo once as inline SVG for the page and once
// as PNG copies beside it (OUT_plots/NAME.png). No scripts or files the page must fetch.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace mm::tools {

struct RunRecord {
  std::string name;  // the folder's name, made unique among the compared runs
  std::string path;
  // metric key -> (iteration, value) in file order; keys as metrics.jsonl names them.
  std::map<std::string, std::vector<std::pair<double, double>>> series;
  std::string config_yaml;   // "" when run_info.json is missing
  nlohmann::json environment = nlohmann::json::object();
};

// Where a run's run_info.json goes beside its metrics file: DIR/run_info.json for
// DIR/metrics.jsonl, DIR/NAME.run_info.json for any other DIR/NAME.jsonl.
std::string run_info_path(const std::string& metrics_path);

// RUN_DIR (metrics.jsonl [+ run_info.json]) or a metrics .jsonl file. mm::Error naming the file
// when there is no metrics file or a line is not JSON.
RunRecord load_run(const std::string& path);

struct ReportOptions {
  double smoothing = 0.9;  // the loss's exponential moving average weight (TensorBoard's slider)
  int width = 640, height = 360;
};

struct ReportSummary {
  std::vector<std::string> plots;  // the plots' names, in page order
  std::vector<std::string> pngs;   // their PNG copies
};

// Writes out_html and its PNG copies (out_html minus ".html" + "_plots/"). mm::Error naming the
// file when it cannot be written; built without cairo, an Error saying so.
ReportSummary write_report(const std::vector<RunRecord>& runs, const std::string& out_html, const ReportOptions& o = {});

// The exponential moving average TensorBoard draws (debiased like its smoothing).
std::vector<std::pair<double, double>> smooth(const std::vector<std::pair<double, double>>& points, double weight);

}  // namespace mm::tools
