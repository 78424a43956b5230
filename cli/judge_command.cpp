// `mm judge`: score moving Fashion-MNIST videos (generated, or the real test clips) with an
// independent judge: a classifier trained only on real Fashion-MNIST images plus the garment's
// centroid track (mindspeed_mm/inference/video_judge.h).
//   mm judge --data samples.jsonl [--report judge.json] [--goal-class 0.7 --goal-direction 0.8]
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/fashion_mnist.h"
#include "mindspeed_mm/data/moving_fashion_mnist.h"
#include "mindspeed_mm/inference/video_judge.h"

namespace mm::cli {
namespace {

struct JudgeArgs {
  std::vector<std::string> data;
  std::string report;
  inference::JudgeOptions o;
  double goal_class = 0.7, goal_direction = 0.8;
} args;

std::string pct(int64_t a, int64_t b) { return cat(a, "/", b, " (", b ? std::lround(1000.0 * a / b) / 10.0 : 0.0, "%)"); }

std::string short_name(int label) {
  std::string s = data::moving_caption(label, 0);
  s = s.substr(s.find(' ') + 1);
  return s.substr(0, s.find(" moving"));
}

int run_judge() {
  std::printf("judge: training the classifier on the 60000 real Fashion-MNIST training images (%s)\n", args.o.source_dir.c_str());
  std::fflush(stdout);
  const inference::FashionJudge judge(args.o, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  std::printf("judge: classifier accuracy on the 10000 real test images: %.1f%%\n", 100.0 * judge.test_accuracy());
  nlohmann::json out = {{"classifier_test_accuracy", judge.test_accuracy()}, {"files", nlohmann::json::array()}};
  bool met = true;
  for (const std::string& path : args.data) {
    const inference::JudgeReport r = judge.judge_jsonl(path);
    std::printf("judge: %s: %lld clips: class right %s, direction right %s, both %s\n", path.c_str(),
                static_cast<long long>(r.clips), pct(r.class_right, r.clips).c_str(), pct(r.direction_right, r.clips).c_str(),
                pct(r.both_right, r.clips).c_str());
    std::string per;
    for (int k = 0; k < 10; ++k)
      if (r.class_total[static_cast<size_t>(k)])
        per += cat(per.empty() ? "" : ", ", short_name(k), " ", r.class_hits[static_cast<size_t>(k)], "/", r.class_total[static_cast<size_t>(k)]);
    std::printf("judge:   class right by class: %s\n", per.c_str());
    const double c = static_cast<double>(r.class_right) / r.clips, d = static_cast<double>(r.direction_right) / r.clips;
    std::printf("judge:   goals: class >= %.0f%%: %s; direction >= %.0f%%: %s\n", 100 * args.goal_class,
                c >= args.goal_class ? "met" : "NOT met", 100 * args.goal_direction, d >= args.goal_direction ? "met" : "NOT met");
    met = met && c >= args.goal_class && d >= args.goal_direction;
    nlohmann::json clips = nlohmann::json::array();
    for (const auto& v : r.verdicts)
      clips.push_back({{"path", v.path}, {"want", data::moving_caption(v.want_label, v.want_direction)},
                       {"class", short_name(v.label)}, {"confidence", v.confidence},
                       {"direction", v.direction < 0 ? "still" : data::moving_directions()[static_cast<size_t>(v.direction)]},
                       {"dx", v.dx}, {"dy", v.dy}});
    out["files"].push_back({{"data", path}, {"clips", r.clips}, {"class_right", r.class_right},
                            {"direction_right", r.direction_right}, {"both_right", r.both_right},
                            {"class_accuracy", c}, {"direction_accuracy", d}, {"verdicts", clips}});
  }
  out["goals_met"] = met;
  if (!args.report.empty()) {
    st::write_file_atomic(args.report, out.dump(2) + "\n");
    std::printf("judge: wrote %s\n", args.report.c_str());
  }
  return 0;
}

}  // namespace

void add_judge_command(CLI::App& app) {
  auto* c = app.add_subcommand("judge", "Score moving Fashion-MNIST videos: class by a classifier trained on real images, direction by the centroid");
  c->add_option("--data", args.data, "JSONL of {\"path\": video, \"cap\": \"a sandal moving left\"} (several allowed)")->required();
  c->add_option("--report", args.report, "write the scores and every clip's reading as JSON");
  c->add_option("--source", args.o.source_dir, "folder of the Fashion-MNIST IDX .gz files");
  c->add_option("--epochs", args.o.epochs, "classifier training epochs (2)");
  c->add_option("--seed", args.o.seed, "classifier seed (0)");
  c->add_option("--goal-class", args.goal_class, "class accuracy the run aims at (0.7)");
  c->add_option("--goal-direction", args.goal_direction, "direction accuracy the run aims at (0.8)");
  register_action(c, run_judge);
}

}  // namespace mm::cli
