#include "mindspeed_mm/training/profile.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/tools/trace.h"
#include "mindspeed_mm/training/plans.h"

namespace mm::training {

using tools::Trace;

int64_t apply_profile_plan(mm::nn::Module& root) {
  int64_t n = 0;
  for_each_module(root, [&](const std::string& path, mm::nn::Module& m) {
    auto* block = dynamic_cast<mm::nn::Block*>(&m);
    if (!block || block->has_wrapper("profile")) return;
    const std::string type = block->type_name();
    block->add_wrapper("profile", [path, type](mm::nn::Block&, const at::Tensor& x, const mm::nn::ForwardContext& ctx,
                                               const mm::nn::BlockCtxFn& next) {
      if (!Trace::on()) return next(x, ctx);
      at::Tensor y;
      {
        tools::TraceScope scope(path, "module", {{"type", type}, {"pass", "forward"}});
        struct Enclosing {  // the operators inside name this block (with_stack)
          explicit Enclosing(const std::string& p) { Trace::module_stack().push_back(p); }
          ~Enclosing() { Trace::module_stack().pop_back(); }
        } enclosing(path);
        y = next(x, ctx);
      }
      // Backward: from the output's gradient arriving to the input's being complete.
      if (at::GradMode::is_enabled() && y.requires_grad() && x.requires_grad()) {
        auto t0 = std::make_shared<double>(-1);
        y.register_hook([t0](const at::TensorBase&) { *t0 = Trace::now_us(); });
        x.register_hook([t0, path, type](const at::TensorBase&) {
          if (*t0 < 0 || !Trace::on()) return;
          tools::TraceEvent e;
          e.name = path;
          e.cat = "module";
          e.ts_us = *t0;
          e.dur_us = Trace::now_us() - *t0;
          e.tid = Trace::thread_id();
          e.args = {{"type", type}, {"pass", "backward"}};
          Trace::add(std::move(e));
          *t0 = -1;
        });
      }
      return y;
    });
    ++n;
  });
  return n;
}

ProfileWindow::ProfileWindow(const config::ProfileConfig& c, int rank, const std::string& default_dir,
                             std::vector<models::ModelPart> parts, double peak_tflops, bool cuda)
    : c_(c), rank_(rank), parts_(std::move(parts)), peak_tflops_(peak_tflops), dir_(c.dir.empty() ? default_dir : c.dir),
      cuda_(cuda) {
  if (c.enabled() && c.memory_snapshot && !cuda)
    throw ConfigError("config: tools.profile.memory_snapshot needs a CUDA device (on the CPU the trace's tensor memory "
                      "track shows live tensors over the window)");
  active_ = c.enabled() && (c.ranks.empty() || std::find(c.ranks.begin(), c.ranks.end(), static_cast<double>(rank)) != c.ranks.end());
  if (!active_) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) throw Error(cat(dir_, ": cannot create the profile directory (", ec.message(), ")"));
}

std::string ProfileWindow::trace_path() const { return cat(dir_, "/trace_rank", rank_, ".json"); }

ProfileWindow::~ProfileWindow() = default;

void ProfileWindow::before_step(int64_t iteration) {
  if (!active_ || open_ || done_ || iteration != c_.start_step) return;
  Trace::start(c_.record_shapes, c_.with_stack);
  if (c_.kineto == "on" || (c_.kineto == "auto" && cuda_)) kineto_ = std::make_unique<tools::KinetoSession>(cuda_, c_.record_shapes);
  if (c_.memory_snapshot) tools::start_cuda_memory_history(/*max_entries=*/200000);
  open_ = true;
}

void ProfileWindow::after_step(int64_t iteration) {
  if (open_ && iteration >= c_.start_step + c_.steps - 1) write();
}

void ProfileWindow::add_flops(const std::vector<std::pair<std::string, double>>& by_part) {
  if (!open_) return;
  for (const auto& [name, f] : by_part) {
    auto it = std::find_if(flops_.begin(), flops_.end(), [&](const auto& p) { return p.first == name; });
    if (it == flops_.end()) flops_.emplace_back(name, f);
    else it->second += f;
  }
}

std::string ProfileWindow::finish() { return open_ ? write() : std::string(); }

std::string ProfileWindow::write() {
  // Kineto's device events join the trace before it closes; its own file stays beside ours.
  if (kineto_) {
    const std::string raw = cat(dir_, "/kineto_rank", rank_, ".json");
    const int64_t n = kineto_->finish(raw, /*cpu_ops=*/!cuda_);
    kineto_.reset();
    log::info("profile: ", n, " events from libtorch's profiler (Kineto) on the timeline; its own trace: ", raw);
  }
  if (c_.memory_snapshot) {
    const std::string path = cat(dir_, "/memory_snapshot_rank", rank_, ".pickle");
    tools::write_cuda_memory_snapshot(path);
    log::info("profile: CUDA allocator history ", path, " (drag it into https://pytorch.org/memory_viz)");
  }
  Trace::stop();
  open_ = false;
  done_ = true;
  const auto events = Trace::events();
  Trace::write(trace_path(), rank_);
  tools::TraceSummary s = tools::summarize(events);
  // FLOPs by part, and each part's blocks' time (a block belongs to the part whose prefix its
  // path has, the longest one).
  s.peak_tflops = peak_tflops_;
  for (const auto& [name, f] : flops_) {
    tools::TraceSummary::Part p;
    p.name = name;
    p.tflop = f / 1e12;
    for (const tools::TraceEvent& e : events) {
      if (e.cat != "module" || parts_.empty()) continue;
      const size_t i = models::part_of(parts_, e.name + ".");
      if (i < parts_.size() && parts_[i].name == name) p.block_ms += e.dur_us / 1e3;
    }
    s.parts.push_back(p);
  }
  summary_ = s.table();
  st::write_file_atomic(cat(dir_, "/profile_summary_rank", rank_, ".json"), s.to_json().dump(2) + "\n");
  log::info("profile: wrote ", trace_path(), " (", events.size(), " events; open it in https://ui.perfetto.dev or chrome://tracing)");
  std::printf("%s", summary_.c_str());
  std::fflush(stdout);
  return summary_;
}

}  // namespace mm::training
