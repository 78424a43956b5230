// Training progress on the console: a one-line bar with ETA on a terminal, plain log lines
// otherwise (files, CI, `mm launch` prefixes), and every record appended to a JSONL file.
#pragma once

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace mm::training {

struct StepMetrics {
  int64_t iteration = 0;
  double loss = 0, lr = 0, grad_norm = 0, step_time_s = 0;
  double tokens_per_s = 0, tflops = 0, mfu = -1;  // mfu < 0: peak unknown
  int64_t tokens = 0;
  double comm_s = 0;            // waiting for collectives in this step (distributed runs)
  int64_t skipped_samples = 0;  // bad samples the data loader skipped so far (shown when > 0)
};

class ProgressReporter {
 public:
  // mode: "auto" | "bar" | "lines" | "silent" (the other ranks of a distributed run); metrics_path may be empty. Appends to an existing file, so a
  // resumed run continues the same record.
  ProgressReporter(const std::string& mode, const std::string& metrics_path, int64_t total_iters, int64_t log_interval);
  ~ProgressReporter();

  void step(const StepMetrics& m);
  // A free-form event (validation, checkpoint): printed as a line and written as a record.
  void event(const std::string& text, const nlohmann::json& record);

 private:
  void clear_bar();
  bool bar_ = false, quiet_ = false;
  bool bar_visible_ = false;
  FILE* metrics_ = nullptr;
  int64_t total_, log_interval_;
  int64_t first_iter_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mm::training
