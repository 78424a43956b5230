// `mm report` (mindspeed_mm/tools/report.h): two tiny training runs reported together. The page
// is self-contained (plots as inline SVG, no fetched resources), holds both runs' configs and
// environments, and its PNG copies show both runs' curves; a real headless Chromium (Debian's
// chromium) loads it with no script error and its screenshot shows the curves in both colours.
// Broken inputs are one-line errors naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "dist_train_runs.h"
#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/tools/report.h"
#include "run_command.h"

namespace fs = std::filesystem;

namespace {

// Pixels within 40 (sum of channel differences) of an RGB colour.
int64_t pixels_near(const mm::data::Image& im, int r, int g, int b) {
  int64_t n = 0;
  for (size_t i = 0; i + 2 < im.rgb.size(); i += 3)
    n += std::abs(im.rgb[i] - r) + std::abs(im.rgb[i + 1] - g) + std::abs(im.rgb[i + 2] - b) < 40;
  return n;
}

const char* chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (fs::exists(p)) return p;
  return nullptr;
}

}  // namespace

TEST(Report, SmoothingIsTensorboardsDebiasedAverage) {
  const auto s = mm::tools::smooth({{1, 4}, {2, 0}, {3, 2}}, 0.5);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_DOUBLE_EQ(s[0].second, 4);                                 // debiased: the first point itself
  EXPECT_DOUBLE_EQ(s[1].second, (0.5 * 0.5 * 4 + 0.5 * 0) / 0.75);  // (0.25*4)/(1-0.25)
  EXPECT_DOUBLE_EQ(s[2].second, (0.125 * 4 + 0.25 * 0 + 0.5 * 2) / 0.875);
}

TEST(Report, TwoRunsOnOnePageThatChromiumRenders) {
  using namespace mm::test;
  const std::string dir = fresh_dir("report");
  const std::string cfg = text_config(dir);
  for (const char* name : {"fast", "slow"}) {
    const std::string lr = std::string(name) == "fast" ? "0.01" : "0.001";
    auto r = run_command(mm_binary() + " train " + cfg + " training.save_dir=" + dir + "/" + name +
                         " training.eval_interval=5 training.eval_iters=2 training.optimizer.lr=" + lr);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  EXPECT_TRUE(fs::exists(dir + "/fast/run_info.json"));
  auto r = run_command(mm_binary() + " report " + dir + "/fast --compare " + dir + "/slow --out " + dir + "/out/report.html");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("report: 2 run(s), "), std::string::npos) << r.output;
  const std::string html = read_file(dir + "/out/report.html");
  for (const char* want : {"<!DOCTYPE html>", "fast", "slow", "train_iters: 20", "libtorch", "world_size",
                           "id=\"plot-loss\"", "id=\"plot-lr\"", "id=\"plot-grad_norm\"", "id=\"plot-throughput\"",
                           "id=\"plot-memory\"", "id=\"plot-memory_reserved\"", "id=\"plot-val_ppl\"", "data:image/svg+xml;base64,"})
    EXPECT_NE(html.find(want), std::string::npos) << want;
  // Self-contained: nothing to fetch.
  for (const char* fetch : {"src=\"http", "href=\"http", "<link", "src=\"/", "src=\"file"})
    EXPECT_EQ(html.find(fetch), std::string::npos) << fetch;
  // PNG copies: the loss plot shows both runs (tab10 blue and red).
  for (const char* plot : {"loss", "lr", "grad_norm", "throughput", "memory", "val_ppl"}) {
    const mm::data::Image im = mm::data::load_image(dir + "/out/report_plots/" + std::string(plot) + ".png");
    EXPECT_EQ(im.width, 640) << plot;
    EXPECT_EQ(im.height, 360) << plot;
  }
  const mm::data::Image loss = mm::data::load_image(dir + "/out/report_plots/loss.png");
  EXPECT_GT(pixels_near(loss, 31, 119, 180), 200) << "run 1's curve";
  EXPECT_GT(pixels_near(loss, 214, 39, 40), 200) << "run 2's curve";

  // A real browser: the page loads (its script reports every plot and no error) and the
  // screenshot shows both colours.
  const char* browser = chromium();
  if (!browser) GTEST_SKIP() << "chromium missing (apt install chromium): the browser half of this test did not run";
  const std::string flags = std::string("timeout 120 ") + browser +
                            " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars --no-first-run "
                            "--window-size=1360,1600 --user-data-dir=" + dir + "/chrome ";
  const std::string url = "file://" + fs::absolute(dir + "/out/report.html").string();
  auto dom = run_command(flags + "--enable-logging=stderr --v=0 --dump-dom " + url + " 2>" + dir + "/console.log");
  ASSERT_EQ(dom.exit_code, 0) << dom.output;
  EXPECT_NE(dom.output.find("loaded 8 plots, errors: 0"), std::string::npos) << dom.output.substr(0, 2000);
  const std::string console = read_file(dir + "/console.log");
  EXPECT_EQ(console.find("Uncaught"), std::string::npos) << console;
  auto shot = run_command(flags + "--screenshot=" + dir + "/shot.png " + url + " 2>/dev/null");
  ASSERT_EQ(shot.exit_code, 0) << shot.output;
  const mm::data::Image png = mm::data::load_image(dir + "/shot.png");
  EXPECT_EQ(png.width, 1360);
  EXPECT_GT(pixels_near(png, 31, 119, 180), 500) << "run 1's curves on screen";
  EXPECT_GT(pixels_near(png, 214, 39, 40), 500) << "run 2's curves on screen";
  std::printf("report: chromium rendered %dx%d, run colours %lld and %lld pixels\n", png.width, png.height,
              static_cast<long long>(pixels_near(png, 31, 119, 180)), static_cast<long long>(pixels_near(png, 214, 39, 40)));
}

TEST(Report, MissingOrBrokenMetricsAreOneLineErrors) {
  using namespace mm::test;
  const std::string dir = fresh_dir("report_bad");
  auto r = run_command(mm_binary() + " report " + dir + "/nothing --out " + dir + "/r.html");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: " + dir + "/nothing: no metrics file"), std::string::npos) << r.output;
  fs::create_directories(dir + "/run");
  write_file(dir + "/run/metrics.jsonl", "{\"iter\":1,\"loss\":2.0}\n{\"iter\":2,\"loss\":\n");
  r = run_command(mm_binary() + " report " + dir + "/run --out " + dir + "/r.html");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(dir + "/run/metrics.jsonl:2: not a JSON record"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/r.html"));
}
