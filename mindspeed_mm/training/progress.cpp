#include "mindspeed_mm/training/progress.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "mindspeed_mm/core/errors.h"

namespace mm::training {
namespace {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof(buf), "%lds", t);
  return buf;
}

std::string format_rate(double v) {
  char buf[32];
  if (v >= 1e6) std::snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof(buf), "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

}  // namespace

ProgressReporter::ProgressReporter(const std::string& mode, const std::string& metrics_path, int64_t total_iters,
                                   int64_t log_interval)
    : total_(total_iters), log_interval_(log_interval), start_(std::chrono::steady_clock::now()) {
  quiet_ = mode == "silent";
  bar_ = mode == "bar" || (mode == "auto" && isatty(fileno(stdout)));
  if (!metrics_path.empty()) {
    auto parent = std::filesystem::path(metrics_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    metrics_ = std::fopen(metrics_path.c_str(), "a");
    if (!metrics_) throw Error(cat("training: cannot open metrics file '", metrics_path, "'"));
  }
}

ProgressReporter::~ProgressReporter() {
  clear_bar();
  if (metrics_) std::fclose(metrics_);
}

void ProgressReporter::clear_bar() {
  if (bar_visible_) {
    std::printf("\r\033[K");
    std::fflush(stdout);
    bar_visible_ = false;
  }
}

void ProgressReporter::step(const StepMetrics& m) {
  if (first_iter_ < 0) {
    first_iter_ = m.iteration - 1;
    start_ = std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                     std::chrono::duration<double>(m.step_time_s));
  }
  if (metrics_) {
    nlohmann::json r = {{"iter", m.iteration}, {"loss", m.loss}, {"lr", m.lr}, {"grad_norm", m.grad_norm},
                        {"step_time_s", m.step_time_s}, {"tokens", m.tokens}, {"tokens_per_s", m.tokens_per_s},
                        {"tflops", m.tflops}};
    if (m.mfu >= 0) r["mfu"] = m.mfu;
    if (m.comm_s > 0) r["comm_s"] = m.comm_s;
    if (m.skipped_samples > 0) r["skipped_samples"] = m.skipped_samples;
    std::fprintf(metrics_, "%s\n", r.dump().c_str());
    std::fflush(metrics_);
  }
  if (quiet_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  int64_t done = m.iteration - first_iter_;
  double eta = done > 0 ? elapsed / done * (total_ - m.iteration) : -1;
  char mfu[32] = "";
  if (m.mfu >= 0) std::snprintf(mfu, sizeof(mfu), " | MFU %.1f%%", 100 * m.mfu);
  char skipped[48] = "";
  if (m.skipped_samples > 0) std::snprintf(skipped, sizeof(skipped), " | skipped %lld", static_cast<long long>(m.skipped_samples));
  char line[512];
  std::snprintf(line, sizeof(line), "loss %.4f | lr %.3e | grad_norm %.3f | %.0f ms | %s tok/s | %.3f TFLOP/s%s%s",
                m.loss, m.lr, m.grad_norm, 1e3 * m.step_time_s, format_rate(m.tokens_per_s).c_str(), m.tflops, mfu,
                skipped);
  if (bar_) {
    const int width = 24;
    int filled = total_ > 0 ? static_cast<int>(width * m.iteration / total_) : width;
    std::string bar(filled, '#');
    bar += std::string(width - filled, '.');
    std::printf("\r\033[K[%s] %lld/%lld %s | ETA %s", bar.c_str(), static_cast<long long>(m.iteration),
                static_cast<long long>(total_), line, format_duration(eta).c_str());
    std::fflush(stdout);
    bar_visible_ = true;
    if (m.iteration == total_) clear_bar();
  } else if (m.iteration % log_interval_ == 0 || m.iteration == total_) {
    std::printf("iter %lld/%lld | %s | ETA %s\n", static_cast<long long>(m.iteration), static_cast<long long>(total_),
                line, format_duration(eta).c_str());
    std::fflush(stdout);
  }
}

void ProgressReporter::event(const std::string& text, const nlohmann::json& record) {
  if (quiet_) return;
  clear_bar();
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
  if (metrics_ && !record.is_null()) {
    std::fprintf(metrics_, "%s\n", record.dump().c_str());
    std::fflush(metrics_);
  }
}

}  // namespace mm::training
