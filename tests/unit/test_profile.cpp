// tools.profile (mindspeed_mm/training/profile.h, tools/trace.h): the summary's arithmetic on
// made-up events (self time of nested operators, communication share), then real runs: the
// Chrome trace of a Qwen2 text run and of the tiny Qwen2-VL holds each step's phases, every
// block's forward and backward as a range named by its path, every operator (with shapes and its
// module when asked); under DDP each rank writes its own trace with the collectives' bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "dist_train_runs.h"
#include "mindspeed_mm/tools/trace.h"
#include "run_command.h"

namespace fs = std::filesystem;
using nlohmann::json;
using mm::tools::TraceEvent;

namespace {

TraceEvent ev(const std::string& name, const std::string& cat, double ts, double dur, int tid = 0, json args = nullptr) {
  TraceEvent e;
  e.name = name;
  e.cat = cat;
  e.ts_us = ts;
  e.dur_us = dur;
  e.tid = tid;
  e.args = std::move(args);
  return e;
}

double row(const std::vector<std::pair<std::string, double>>& rows, const std::string& name) {
  for (const auto& [n, ms] : rows)
    if (n == name) return ms;
  return -1;
}

// Every event of a trace file by category, after checking the Chrome trace format's fields.
std::map<std::string, std::vector<json>> load_trace(const std::string& path) {
  const json t = json::parse(mm::test::read_file(path));
  EXPECT_EQ(t["displayTimeUnit"], "ms");
  std::map<std::string, std::vector<json>> by_cat;
  for (const json& e : t["traceEvents"]) {
    EXPECT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid") && e.contains("name")) << e.dump();
    if (e["ph"] == "M") continue;
    if (e["ph"] == "C") {  // the tensor memory track: a sample of live tensor bytes
      EXPECT_EQ(e["cat"], "memory") << e.dump();
      EXPECT_GT(e["args"]["MiB"].get<double>(), 0.0) << e.dump();
      by_cat["memory"].push_back(e);
      continue;
    }
    EXPECT_EQ(e["ph"], "X") << e.dump();
    EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
    by_cat[e["cat"].get<std::string>()].push_back(e);
  }
  return by_cat;
}

}  // namespace

TEST(Profile, SummaryCountsSelfTimeAndCommunicationShare) {
  std::vector<TraceEvent> events = {
      ev("step", "phase", 0, 10000), ev("forward", "phase", 100, 4000), ev("backward", "phase", 4200, 5000),
      ev("model.layers.0", "module", 200, 1000, 0, {{"type", "Qwen2DecoderLayer"}, {"pass", "forward"}}),
      ev("model.layers.1", "module", 1300, 1000, 0, {{"type", "Qwen2DecoderLayer"}, {"pass", "forward"}}),
      ev("model.layers.1", "module", 4300, 2000, 0, {{"type", "Qwen2DecoderLayer"}, {"pass", "backward"}}),
      // aten::linear (900 us) calls aten::addmm (700 us), which calls nothing; another thread's addmm.
      ev("aten::linear", "op", 200, 900), ev("aten::addmm", "op", 250, 700), ev("aten::addmm", "op", 300, 100, 1),
      ev("all_reduce", "comm", 9000, 500, 0, {{"bytes", 4096}}), ev("all_reduce", "comm", 9600, 250)};
  const mm::tools::TraceSummary s = mm::tools::summarize(events);
  EXPECT_EQ(s.steps, 1);
  EXPECT_DOUBLE_EQ(s.steps_ms, 10.0);
  EXPECT_DOUBLE_EQ(row(s.phases_ms, "forward"), 4.0);
  EXPECT_DOUBLE_EQ(row(s.phases_ms, "backward"), 5.0);
  EXPECT_DOUBLE_EQ(row(s.modules_ms, "Qwen2DecoderLayer forward"), 2.0);
  EXPECT_DOUBLE_EQ(row(s.modules_ms, "Qwen2DecoderLayer backward"), 2.0);
  EXPECT_DOUBLE_EQ(row(s.ops_self_ms, "aten::linear"), 0.2);
  EXPECT_DOUBLE_EQ(row(s.ops_self_ms, "aten::addmm"), 0.8);
  EXPECT_EQ(s.ops_self_ms.front().first, "aten::addmm");  // largest self time first
  EXPECT_DOUBLE_EQ(s.comm_total_ms, 0.75);
  const std::string table = s.table();
  EXPECT_NE(table.find("communication share of the steps: 7.5%"), std::string::npos) << table;
  EXPECT_NE(table.find("top operators by self time"), std::string::npos) << table;
}

TEST(Profile, TextRunTraceHasPhasesBlocksAndOperators) {
  using namespace mm::test;
  const std::string dir = fresh_dir("profile_text");
  const std::string cfg = text_config(dir);
  const TrainRun run = train(cfg, 1, dir + "/m.jsonl",
                             "training.train_iters=5 training.save_dir=" + dir + "/save training.save_interval=3 "
                             "tools.profile.start_step=2 tools.profile.steps=2 tools.profile.record_shapes=true "
                             "tools.profile.with_stack=true");
  ASSERT_EQ(run.losses.size(), 5u) << run.output;
  const std::string trace = dir + "/save/profile/trace_rank0.json";
  EXPECT_NE(run.output.find("plan: profiling steps 2-3 (2 blocks as ranges) into " + trace), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("profile: 2 step(s)"), std::string::npos) << run.output;
  auto by_cat = load_trace(trace);
  std::map<std::string, int> phases;
  for (const json& e : by_cat["phase"]) ++phases[e["name"].get<std::string>()];
  EXPECT_EQ(phases["step"], 2);
  EXPECT_EQ(phases["data"], 2);
  EXPECT_GE(phases["forward"], 2);
  EXPECT_GE(phases["backward"], 2);
  EXPECT_EQ(phases["optimizer"], 2);
  EXPECT_EQ(phases["checkpoint"], 1) << "the save after step 3 is inside the window";
  std::set<std::string> ranges;
  for (const json& e : by_cat["module"]) ranges.insert(e["name"].get<std::string>() + " " + e["args"]["pass"].get<std::string>());
  EXPECT_EQ(ranges, (std::set<std::string>{"model.layers.0 forward", "model.layers.0 backward", "model.layers.1 forward",
                                           "model.layers.1 backward"}));
  // The memory track: a layer's forward leaves its saved activations (grows live tensor bytes),
  // and backward gives them back; a sample at both ends of every phase and forward range.
  EXPECT_GE(by_cat["memory"].size(), 2 * (by_cat["phase"].size()));
  for (const json& e : by_cat["module"])
    if (e["args"]["pass"] == "forward") EXPECT_GT(e["args"]["tensor_mib_delta"].get<double>(), 0.0) << e.dump();
  for (const json& e : by_cat["phase"])
    if (e["name"] == "backward") EXPECT_LT(e["args"]["tensor_mib_delta"].get<double>(), 0.0) << e.dump();
  // Operators with their input shapes and, inside a block, the block's path.
  bool mm_in_block = false;
  for (const json& e : by_cat["op"]) {
    ASSERT_TRUE(e["args"].contains("shapes")) << e.dump();
    if ((e["name"] == "aten::mm" || e["name"] == "aten::addmm" || e["name"] == "aten::linear") && e["args"].contains("module"))
      mm_in_block = mm_in_block || e["args"]["module"].get<std::string>().rfind("model.layers.", 0) == 0;
  }
  EXPECT_TRUE(mm_in_block);
  EXPECT_FALSE(by_cat["op_backward"].empty()) << "autograd nodes in the backward";
  const json summary = json::parse(read_file(dir + "/save/profile/profile_summary_rank0.json"));
  EXPECT_EQ(summary["steps"], 2);
  EXPECT_FALSE(summary["top_ops"].empty());
  // One part (the whole Qwen2): its FLOPs and its layers' time.
  ASSERT_EQ(summary["parts"].size(), 1u) << summary.dump();
  EXPECT_EQ(summary["parts"][0]["name"], "model");
  EXPECT_GT(summary["parts"][0]["tflop"].get<double>(), 0.0);
  EXPECT_GT(summary["parts"][0]["block_ms"].get<double>(), 0.0);
  // The window covers steps 2 and 3 only.
  for (const json& e : by_cat["phase"])
    if (e["name"] == "step") EXPECT_TRUE(e["args"]["iteration"] == 2 || e["args"]["iteration"] == 3) << e.dump();
}

TEST(Profile, DdpRanksTraceTheirCollectivesAndVisionBlocksAreRanges) {
  using namespace mm::test;
  const std::string dir = fresh_dir("profile_ddp");
  const std::string cfg = vl_config(dir, 12);
  // One process first: the FLOPs by part (vision tower, projector, language model) add up to the
  // FLOPs the steps report, and MFU per part against tools.peak_tflops adds up to the steps' MFU.
  {
    const TrainRun one = train(cfg, 1, dir + "/one.jsonl",
                               "training.train_iters=4 training.micro_batch_size=2 tools.peak_tflops=0.05 "
                               "tools.profile.start_step=2 tools.profile.steps=2 tools.profile.dir=" + dir + "/one_prof");
    ASSERT_EQ(one.losses.size(), 4u) << one.output;
    EXPECT_NE(one.output.find("FLOPs by part"), std::string::npos) << one.output;
    const json s = json::parse(read_file(dir + "/one_prof/profile_summary_rank0.json"));
    ASSERT_EQ(s["parts"].size(), 3u) << s.dump();
    std::map<std::string, json> parts;
    for (const json& p : s["parts"]) parts[p["name"].get<std::string>()] = p;
    for (const char* name : {"vision_tower", "projector", "language_model"}) ASSERT_TRUE(parts.count(name)) << name;
    EXPECT_GT(parts["vision_tower"]["block_ms"].get<double>(), 0.0);
    EXPECT_GT(parts["language_model"]["block_ms"].get<double>(), 0.0);
    EXPECT_EQ(parts["projector"]["block_ms"].get<double>(), 0.0) << "the merger is no block";
    double tflop = 0, mfu = 0;
    for (auto& [name, p] : parts) {
      EXPECT_GT(p["tflop"].get<double>(), 0.0) << name;
      tflop += p["tflop"].get<double>();
      mfu += p["mfu"].get<double>();
    }
    // metrics.jsonl: tflops (TFLOP/s) x step time = each step's TFLOP.
    double want = 0;
    std::istringstream in(read_file(dir + "/one.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("tflops") && (j["iter"] == 2 || j["iter"] == 3)) want += j["tflops"].get<double>() * j["step_time_s"].get<double>();
    }
    EXPECT_NEAR(tflop, want, 1e-9 + 1e-6 * want);
    EXPECT_NEAR(mfu, tflop / (s["steps_ms"].get<double>() / 1e3) / 0.05, 1e-9);
  }
  const TrainRun run = train(cfg, 2, dir + "/m.jsonl",
                             "training.train_iters=3 parallel.data_parallel_replicate_size=2 training.micro_batch_size=2 "
                             "tools.profile.start_step=2 tools.profile.steps=1 tools.profile.ranks=[] tools.profile.dir=" +
                                 dir + "/prof");
  ASSERT_EQ(run.losses.size(), 3u) << run.output;
  for (int r = 0; r < 2; ++r) {
    auto by_cat = load_trace(dir + "/prof/trace_rank" + std::to_string(r) + ".json");
    int64_t reduced = 0;
    for (const json& e : by_cat["comm"]) {
      EXPECT_EQ(e["pid"], r);
      if (e["name"] == "all_reduce") reduced += e["args"]["bytes"].get<int64_t>();
      EXPECT_GE(e["args"]["wait_us"].get<double>(), 0.0);
    }
    EXPECT_GT(reduced, 4 * 10000) << "rank " << r << ": DDP's gradient all-reduce is in the trace";
    std::set<std::string> blocks;
    for (const json& e : by_cat["module"]) blocks.insert(e["name"].get<std::string>());
    EXPECT_TRUE(blocks.count("visual.blocks.0") && blocks.count("visual.blocks.1") && blocks.count("model.layers.1"))
        << "rank " << r;
  }
  EXPECT_NE(run.output.find("communication share of the steps"), std::string::npos) << run.output;
}

// tools.profile.kineto: on (the CPU): libtorch's profiler runs in the window and its operators
// land on our timeline (the anchor aligns the clocks): each of our matmuls has Kineto's within
// 50 us. Its own trace stays beside ours. A memory snapshot without CUDA is a one-line error.
TEST(Profile, KinetoJoinsTheTimelineAndSnapshotsNeedCuda) {
  using namespace mm::test;
  const std::string dir = fresh_dir("profile_kineto");
  const std::string cfg = text_config(dir);
  const TrainRun run = train(cfg, 1, dir + "/m.jsonl",
                             "training.train_iters=3 training.save_dir=" + dir + "/save training.save_interval=0 "
                             "tools.profile.start_step=2 tools.profile.steps=1 tools.profile.kineto=on");
  ASSERT_EQ(run.losses.size(), 3u) << run.output;
  EXPECT_NE(run.output.find("events from libtorch's profiler (Kineto) on the timeline"), std::string::npos) << run.output;
  EXPECT_TRUE(json::parse(read_file(dir + "/save/profile/kineto_rank0.json")).contains("traceEvents"));
  auto by_cat = load_trace(dir + "/save/profile/trace_rank0.json");
  std::vector<double> kineto_mm;
  for (const json& e : by_cat["kineto_cpu_op"])
    if (e["name"] == "aten::mm") kineto_mm.push_back(e["ts"].get<double>());
  std::sort(kineto_mm.begin(), kineto_mm.end());
  int ours = 0;
  for (const json& e : by_cat["op"]) {
    if (e["name"] != "aten::mm") continue;
    ++ours;
    const double ts = e["ts"].get<double>();
    auto it = std::lower_bound(kineto_mm.begin(), kineto_mm.end(), ts);
    double best = 1e300;
    if (it != kineto_mm.end()) best = std::min(best, *it - ts);
    if (it != kineto_mm.begin()) best = std::min(best, ts - *(it - 1));
    EXPECT_LT(best, 50.0) << "aten::mm at " << ts;
  }
  EXPECT_GT(ours, 5);
  EXPECT_EQ(kineto_mm.size(), static_cast<size_t>(ours));
  const std::string trace_text = read_file(dir + "/save/profile/trace_rank0.json");
  EXPECT_NE(trace_text.find("kineto cpu ops"), std::string::npos);
  auto snap = run_command(mm_binary() + " train " + cfg + " training.train_iters=2 tools.profile.steps=1 "
                          "tools.profile.memory_snapshot=true training.save_dir=" + dir + "/snap");
  EXPECT_EQ(snap.exit_code, 2) << snap.output;
  EXPECT_NE(snap.output.find("error: config: tools.profile.memory_snapshot needs a CUDA device"), std::string::npos)
      << snap.output;
}
