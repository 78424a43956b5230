#include "mindspeed_mm/tools/kineto.h"

#include <ATen/record_function.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#ifdef MM_WITH_CUDA
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/tools/trace.h"

namespace mm::tools {

namespace {
namespace prof = torch::profiler::impl;
constexpr const char* kAnchor = "mm::trace_anchor";
}  // namespace

KinetoSession::KinetoSession(bool cuda, bool record_shapes) {
  std::set<prof::ActivityType> activities = {prof::ActivityType::CPU};
  if (cuda) activities.insert(prof::ActivityType::CUDA);
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO, record_shapes);
  try {
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  } catch (const c10::Error& e) {
    throw Error(cat("tools.profile: libtorch's profiler (Kineto) did not start: ", e.what_without_backtrace()));
  }
  running_ = true;
  // One range both traces hold: its start on each clock gives their offset.
  RECORD_USER_SCOPE(kAnchor);
  anchor_us_ = Trace::now_us();
}

KinetoSession::~KinetoSession() {
  if (!running_) return;
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (...) {
  }
}

int64_t KinetoSession::finish(const std::string& raw_path, bool cpu_ops) {
  if (!running_) return 0;
  running_ = false;
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  result->save(raw_path);
  nlohmann::json trace;
  try {
    std::ifstream in(raw_path);
    trace = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(cat(raw_path, ": cannot read Kineto's trace (", e.what(), ")"));
  }
  const nlohmann::json& events = trace.contains("traceEvents") ? trace["traceEvents"] : nlohmann::json::array();
  double offset = 0;
  bool anchored = false;
  for (const auto& e : events)
    if (e.value("name", "") == kAnchor && e.contains("ts")) {
      offset = e["ts"].get<double>() - anchor_us_;
      anchored = true;
      break;
    }
  if (!anchored) throw Error(cat(raw_path, ": Kineto's trace lacks the ", kAnchor, " range that aligns it"));
  static const std::set<std::string> kDevice = {"kernel", "gpu_memcpy", "gpu_memset"};
  std::map<std::pair<int64_t, int64_t>, int> streams;  // (device, stream) -> our tid
  constexpr int kCpuOpsTid = 90, kFirstStreamTid = 100;
  int64_t added = 0;
  for (const auto& e : events) {
    if (e.value("ph", "") != "X" || !e.contains("ts")) continue;
    const std::string cat_name = e.value("cat", "");
    const bool device = kDevice.count(cat_name) > 0;
    if (!device && !(cpu_ops && cat_name == "cpu_op")) continue;
    TraceEvent t;
    t.name = e.value("name", "");
    t.cat = device ? cat_name : "kineto_cpu_op";
    t.ts_us = e["ts"].get<double>() - offset;
    t.dur_us = e.value("dur", 0.0);
    if (device) {
      const auto key = std::make_pair(e.value("pid", int64_t(0)), e.value("tid", int64_t(0)));
      auto it = streams.find(key);
      if (it == streams.end()) {
        it = streams.emplace(key, kFirstStreamTid + static_cast<int>(streams.size())).first;
        Trace::name_thread(it->second, cat("cuda:", key.first, " stream ", key.second));
      }
      t.tid = it->second;
    } else {
      t.tid = kCpuOpsTid;
    }
    if (e.contains("args") && e["args"].is_object()) t.args = e["args"];
    Trace::add(std::move(t));
    ++added;
  }
  if (cpu_ops) Trace::name_thread(kCpuOpsTid, "kineto cpu ops");
  return added;
}

void start_cuda_memory_history(int64_t max_entries) {
#ifdef MM_WITH_CUDA
  torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::optional<std::string>("all"), "python",
                                      static_cast<size_t>(max_entries));
#else
  (void)max_entries;
  throw ConfigError("config: tools.profile.memory_snapshot needs a CUDA build and device (on the CPU the trace's "
                    "tensor memory track shows live tensors over the window)");
#endif
}

void write_cuda_memory_snapshot(const std::string& path) {
#ifdef MM_WITH_CUDA
  const std::string pickled = torch::cuda::_memory_snapshot_pickled();
  torch::cuda::_record_memory_history(std::optional<std::string>());
  st::write_file_atomic(path, pickled);
#else
  throw Error(cat(path, ": CUDA memory snapshots need a CUDA build"));
#endif
}

}  // namespace mm::tools
