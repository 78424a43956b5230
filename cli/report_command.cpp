// `mm report`: a run's plots, config and environment as one self-contained HTML page
// (mindspeed_mm/tools/report.h).
//   mm report RUN_DIR [--compare RUN_DIR ...] --out report.html [--smoothing 0.9]
#include <cstdio>

#include "cli/commands.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/tools/report.h"

namespace mm::cli {
namespace {

struct ReportArgs {
  std::string run, out = "report.html";
  std::vector<std::string> compare;
  tools::ReportOptions o;
} report_args;

int run_report() {
  std::vector<tools::RunRecord> runs;
  runs.push_back(tools::load_run(report_args.run));
  for (const auto& c : report_args.compare) runs.push_back(tools::load_run(c));
  // Two runs from folders of the same name: number them.
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (runs[i].name == runs[j].name) runs[i].name += cat(" (", i + 1, ")");
  const tools::ReportSummary s = tools::write_report(runs, report_args.out, report_args.o);
  std::printf("report: %zu run(s), %zu plots (%s) -> %s; PNG copies beside it\n", runs.size(), s.plots.size(),
              [&] {
                std::string names;
                for (const auto& p : s.plots) names += (names.empty() ? "" : ", ") + p;
                return names;
              }()
                  .c_str(),
              report_args.out.c_str());
  return 0;
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto* c = app.add_subcommand("report", "A training run's plots, config and environment as one HTML page");
  c->add_option("run", report_args.run, "the run's save_dir (metrics.jsonl, run_info.json) or a metrics .jsonl")->required();
  c->add_option("--compare", report_args.compare, "more runs drawn on the same plots");
  c->add_option("--out", report_args.out, "the HTML page to write (PNG copies go to OUT_plots/)");
  c->add_option("--smoothing", report_args.o.smoothing, "the loss curve's moving-average weight, 0-0.999")
      ->check(CLI::Range(0.0, 0.999));
  c->footer(
      "Examples:\n"
      "  mm report out/quickstart_vl --out out/quickstart_vl/report.html\n"
      "  mm report out/run_a --compare out/run_b --compare out/run_c --out compare.html\n"
      "Exit codes: 0 written, 1 a missing or broken run file.");
  register_action(c, run_report);
}

}  // namespace mm::cli
