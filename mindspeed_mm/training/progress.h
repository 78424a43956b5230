// Training progress on the console: a one-line bar with ETA on a terminal, plain log lines
// otherwise (files, CI, `mm launch` prefixes), and every record appended to a JSONL file.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "mindspeed_mm/tools/tensorboard.h"

namespace mm::training {

struct StepMetrics {
  int64_t iteration = 0;
  double loss = 0, lr = 0, grad_norm = 0, step_time_s = 0;
  double tokens_per_s = 0, tflops = 0, mfu = -1;  // mfu < 0: peak unknown
  int64_t tokens = 0;
  double comm_s = 0;            // waiting for collectives in this step (distributed runs)
  int64_t skipped_samples = 0;  // bad samples the data loader skipped so far (shown when > 0)
  // Memory at the step's end and its peak during the step (mm::memory_stats): live tensor bytes,
  // and what the process holds (CUDA: the caching allocator's reserved bytes; CPU: the resident set).
  int64_t mem_bytes = 0, mem_peak_bytes = 0;
  int64_t mem_reserved_bytes = 0, mem_peak_reserved_bytes = 0;
  const char* mem_reserved_label = "reserved";  // "rss" on the CPU: the process's resident set
};

class ProgressReporter {
 public:
  // mode: "auto" | "bar" | "lines" | "silent" (the other ranks of a distributed run); metrics_path may be empty. Appends to an existing file, so a
  // resumed run continues the same record.
  ProgressReporter(const std::string& mode, const std::string& metrics_path, int64_t total_iters, int64_t log_interval);
  ~ProgressReporter();

  void step(const StepMetrics& m);
  // Also writes every step's metrics and every event's numbers as TensorBoard scalars to DIR
  // (train/loss, validation/loss, memory/...), the resolved config as text and the planned
  // learning-rate schedule (lr_at(it) for it in [first_iter, total)).
  void enable_tensorboard(const std::string& dir, const std::string& config_yaml, int64_t first_iter,
                          const std::function<double(int64_t)>& lr_at);
  tools::EventWriter* tensorboard() { return tb_.get(); }
  // A free-form event (validation, checkpoint): printed as a line and written as a record.
  void event(const std::string& text, const nlohmann::json& record);

 private:
  void clear_bar();
  bool bar_ = false, quiet_ = false;
  bool bar_visible_ = false;
  FILE* metrics_ = nullptr;
  std::unique_ptr<tools::EventWriter> tb_;
  int64_t total_, log_interval_;
  int64_t first_iter_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mm::training
