// `tools.profile`: which steps and ranks are traced, the module ranges, and what is written.
//
//   tools: {profile: {start_step: 2, steps: 2, ranks: [0], record_shapes: false, with_stack: false}}
//
// Each traced rank writes DIR/trace_rank{r}.json (Chrome trace: the step's phases, every block's
// forward and backward as a range named by its path, each collective with its bytes and wait,
// every ATen operator) and DIR/profile_summary_rank{r}.json, and prints the summary table (time
// by phase and by module type, communication share, top operators by self time). Nothing is
// installed when the profile is off.
#pragma once

#include <memory>
#include <string>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/models/model.h"
#include "mindspeed_mm/tools/kineto.h"

namespace mm::training {

// A "profile" wrapper on every block: while a window is open, its forward is a range named by the
// block's path ("model.layers.3", args type and pass) and so is its backward (from the output's
// gradient to the input's). Returns the number of blocks.
int64_t apply_profile_plan(mm::nn::Module& root);

class ProfileWindow {
 public:
  // dir "" = default_dir. Inactive (every call a no-op) when the profile is off or rank not listed.
  // cuda: the run's device is a GPU (Kineto's kernels by default, memory snapshots possible);
  // ConfigError for tools.profile.memory_snapshot without one.
  ProfileWindow(const config::ProfileConfig& c, int rank, const std::string& default_dir,
                std::vector<models::ModelPart> parts = {}, double peak_tflops = 0, bool cuda = false);
  ~ProfileWindow();
  bool active() const { return active_; }
  bool recording() const { return open_; }
  // Around each training step; `iteration` is the step's 1-based number.
  void before_step(int64_t iteration);
  void after_step(int64_t iteration);
  // A micro-batch's training FLOPs by part (Model::training_flops_by_part), counted while open.
  void add_flops(const std::vector<std::pair<std::string, double>>& by_part);
  // Closes a window still open (the run ended inside it) and writes it. Returns the summary
  // table printed ("" when nothing was traced).
  std::string finish();
  // The summary of the last written window ("" before one is written).
  const std::string& summary() const { return summary_; }
  std::string trace_path() const;

 private:
  std::string write();
  config::ProfileConfig c_;
  int rank_;
  std::vector<models::ModelPart> parts_;
  double peak_tflops_;
  std::vector<std::pair<std::string, double>> flops_;  // by part, in first-seen order
  std::string dir_, summary_;
  bool active_ = false, open_ = false, done_ = false, cuda_ = false;
  std::unique_ptr<tools::KinetoSession> kineto_;
};

}  // namespace mm::training
