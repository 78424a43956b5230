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

// A step's peak memory: "595 MiB", "12.3 GiB".
std::string format_bytes(int64_t b) {
  char buf[32];
  const double mib = b / 1048576.0;
  if (mib >= 10240) std::snprintf(buf, sizeof(buf), "%.1f GiB", mib / 1024);
  else std::snprintf(buf, sizeof(buf), "%.0f MiB", mib);
  return buf;
}

// TensorBoard's tag of an event record's number: validation/..., memory/..., or events/....
std::string tag_of(const std::string& key) {
  if (key.rfind("val_", 0) == 0) return "validation/" + key.substr(4);
  if (key.find("bytes") != std::string::npos || key.find("rss") != std::string::npos) return "memory/" + key;
  return "events/" + key;
}

}  // namespace

void ProgressReporter::enable_tensorboard(const std::string& dir, const std::string& config_yaml, int64_t first_iter,
                                          const std::function<double(int64_t)>& lr_at) {
  if (quiet_) return;
  tb_ = std::make_unique<tools::EventWriter>(dir);
  // Markdown: indented lines are a code block, so the YAML keeps its layout.
  std::string text;
  for (size_t at = 0; at < config_yaml.size();) {
    size_t end = config_yaml.find('\n', at);
    if (end == std::string::npos) end = config_yaml.size();
    text += "    " + config_yaml.substr(at, end - at) + "\n";
    at = end + 1;
  }
  tb_->add_text("config", text, first_iter);
  if (lr_at)
    for (int64_t it = first_iter; it < total_; ++it) tb_->add_scalar("schedule/lr", lr_at(it), it + 1);
}

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
    if (m.mem_peak_bytes > 0) {
      r["mem_bytes"] = m.mem_bytes;
      r["mem_peak_bytes"] = m.mem_peak_bytes;
    }
    if (m.mem_peak_reserved_bytes > 0) {
      r["mem_reserved_bytes"] = m.mem_reserved_bytes;
      r["mem_peak_reserved_bytes"] = m.mem_peak_reserved_bytes;
    }
    std::fprintf(metrics_, "%s\n", r.dump().c_str());
    std::fflush(metrics_);
  }
  if (tb_) {
    const int64_t it = m.iteration;
    tb_->add_scalar("train/loss", m.loss, it);
    tb_->add_scalar("train/lr", m.lr, it);
    tb_->add_scalar("train/grad_norm", m.grad_norm, it);
    tb_->add_scalar("train/step_time_s", m.step_time_s, it);
    tb_->add_scalar("train/tokens_per_s", m.tokens_per_s, it);
    tb_->add_scalar("train/tflops", m.tflops, it);
    if (m.mfu >= 0) tb_->add_scalar("train/mfu", m.mfu, it);
    if (m.comm_s > 0) tb_->add_scalar("train/comm_s", m.comm_s, it);
    if (m.mem_peak_bytes > 0) {
      tb_->add_scalar("memory/mem_mib", m.mem_bytes / 1048576.0, it);
      tb_->add_scalar("memory/mem_peak_mib", m.mem_peak_bytes / 1048576.0, it);
    }
    if (m.mem_peak_reserved_bytes > 0) {
      tb_->add_scalar("memory/mem_reserved_mib", m.mem_reserved_bytes / 1048576.0, it);
      tb_->add_scalar("memory/mem_peak_reserved_mib", m.mem_peak_reserved_bytes / 1048576.0, it);
    }
  }
  if (quiet_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  int64_t done = m.iteration - first_iter_;
  double eta = done > 0 ? elapsed / done * (total_ - m.iteration) : -1;
  char mfu[32] = "";
  if (m.mfu >= 0) std::snprintf(mfu, sizeof(mfu), " | MFU %.1f%%", 100 * m.mfu);
  char skipped[48] = "";
  if (m.skipped_samples > 0) std::snprintf(skipped, sizeof(skipped), " | skipped %lld", static_cast<long long>(m.skipped_samples));
  char mem[64] = "";
  if (m.mem_peak_reserved_bytes > 0)
    std::snprintf(mem, sizeof(mem), " | mem %s (%s %s)", format_bytes(m.mem_peak_bytes).c_str(), m.mem_reserved_label,
                  format_bytes(m.mem_peak_reserved_bytes).c_str());
  else if (m.mem_peak_bytes > 0)
    std::snprintf(mem, sizeof(mem), " | mem %s", format_bytes(m.mem_peak_bytes).c_str());
  char line[640];
  std::snprintf(line, sizeof(line), "loss %.4f | lr %.3e | grad_norm %.3f | %.0f ms | %s tok/s | %.3f TFLOP/s%s%s%s",
                m.loss, m.lr, m.grad_norm, 1e3 * m.step_time_s, format_rate(m.tokens_per_s).c_str(), m.tflops, mfu,
                mem, skipped);
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
  if (tb_ && record.is_object() && record.contains("iter") && record["iter"].is_number_integer()) {
    const int64_t it = record["iter"].get<int64_t>();
    for (const auto& [key, value] : record.items())
      if (key != "iter" && value.is_number()) tb_->add_scalar(tag_of(key), value.get<double>(), it);
    // A language model's closing sample (tools.sample): prompt and continuation as text.
    if (record.contains("sample") && record["sample"].is_string())
      tb_->add_text("samples/text", record.value("sample_prompt", std::string()) + record["sample"].get<std::string>(), it);
  }
}

}  // namespace mm::training
