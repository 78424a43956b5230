#include "mindspeed_mm/tools/trace.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/checkpoint/safetensors.h"

namespace mm::tools {

std::atomic<bool> Trace::on_{false};

namespace {

std::mutex g_mutex;
std::vector<TraceEvent> g_events;
std::map<int, std::string> g_thread_names;
std::chrono::steady_clock::time_point g_origin = std::chrono::steady_clock::now();
std::atomic<int> g_next_tid{0};
std::optional<at::CallbackHandle> g_callback;
bool g_with_stack = false;

struct OpContext : at::ObserverContext {
  double t0 = 0;
  nlohmann::json args;
};

std::string shape_of(const c10::IValue& v) {
  if (!v.isTensor()) return v.isScalar() ? "scalar" : v.tagKind();
  const at::Tensor& t = v.toTensor();
  if (!t.defined()) return "undefined";
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? "," : "") + std::to_string(t.size(i));
  return s + "]";
}

std::unique_ptr<at::ObserverContext> op_start(const at::RecordFunction& fn) {
  auto ctx = std::make_unique<OpContext>();
  ctx->t0 = Trace::now_us();
  if (fn.needsInputs()) {
    nlohmann::json shapes = nlohmann::json::array();
    for (const c10::IValue& v : fn.inputs()) shapes.push_back(shape_of(v));
    ctx->args["shapes"] = std::move(shapes);
  }
  if (g_with_stack && !Trace::module_stack().empty()) ctx->args["module"] = Trace::module_stack().back();
  return ctx;
}

void op_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  auto* ctx = static_cast<OpContext*>(raw);
  if (!ctx || !Trace::on()) return;
  TraceEvent e;
  e.name = fn.name();
  e.cat = fn.scope() == at::RecordScope::BACKWARD_FUNCTION ? "op_backward" : "op";
  e.ts_us = ctx->t0;
  e.dur_us = Trace::now_us() - ctx->t0;
  e.tid = Trace::thread_id();
  e.args = std::move(ctx->args);
  Trace::add(std::move(e));
}

}  // namespace

double Trace::now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - g_origin).count();
}

int Trace::thread_id() {
  thread_local int id = -1;
  if (id < 0) {
    id = g_next_tid++;
    std::lock_guard<std::mutex> lock(g_mutex);
    g_thread_names[id] = id == 0 ? "main" : "thread " + std::to_string(id);
  }
  return id;
}

void Trace::name_thread(int tid, std::string name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_thread_names[tid] = std::move(name);
}

std::vector<std::string>& Trace::module_stack() {
  thread_local std::vector<std::string> stack;
  return stack;
}

void Trace::start(bool record_shapes, bool with_stack) {
  stop();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_events.clear();
    g_origin = std::chrono::steady_clock::now();
  }
  (void)thread_id();  // the caller (the training loop) is "main"
  g_with_stack = with_stack;
  g_callback = at::addGlobalCallback(at::RecordFunctionCallback(op_start, op_end)
                                         .needsInputs(record_shapes)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  on_.store(true);
}

void Trace::stop() {
  on_.store(false);
  if (g_callback) {
    at::removeCallback(*g_callback);
    g_callback.reset();
  }
}

namespace {
std::function<int64_t()> g_memory_source;  // set outside windows only

int64_t live_tensor_bytes() { return g_memory_source ? g_memory_source() : -1; }

void add_memory_sample(double ts, int64_t bytes) {
  TraceEvent c;
  c.ph = 'C';
  c.name = "tensor memory";
  c.cat = "memory";
  c.ts_us = ts;
  c.args = {{"MiB", static_cast<double>(bytes) / 1048576.0}};
  Trace::add(std::move(c));
}
}  // namespace

void Trace::set_memory_source(std::function<int64_t()> source) { g_memory_source = std::move(source); }

void Trace::add(TraceEvent e) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.push_back(std::move(e));
}

std::vector<TraceEvent> Trace::events() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_events;
}

void Trace::write(const std::string& path, int rank) {
  std::vector<TraceEvent> events = Trace::events();
  std::sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.ts_us < b.ts_us; });
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto put = [&](const nlohmann::json& j) {
    if (!first) out += ",\n";
    first = false;
    out += j.dump();
  };
  put({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 0}, {"args", {{"name", cat("rank ", rank)}}}});
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [tid, name] : g_thread_names)
      put({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", name}}}});
  }
  for (const TraceEvent& e : events) {
    nlohmann::json j = {{"name", e.name}, {"cat", e.cat}, {"ph", std::string(1, e.ph)}, {"ts", e.ts_us},
                        {"pid", rank}, {"tid", e.tid}};
    if (e.ph == 'X') j["dur"] = e.dur_us;
    if (e.args.is_object()) j["args"] = e.args;
    put(j);
  }
  out += "\n]}\n";
  st::write_file_atomic(path, out);
}

TraceScope::TraceScope(const char* name, const char* cat, nlohmann::json args)
    : TraceScope(std::string(name), cat, std::move(args)) {}

TraceScope::TraceScope(std::string name, const char* cat, nlohmann::json args) : active_(Trace::on()), cat_(cat) {
  if (!active_) return;
  name_ = std::move(name);
  args_ = std::move(args);
  t0_ = Trace::now_us();
  if (cat_[0] == 'p' || cat_[0] == 'm') {  // phase, module
    mem0_ = live_tensor_bytes();
    if (mem0_ >= 0) add_memory_sample(t0_, mem0_);
  }
}

TraceScope::~TraceScope() {
  if (!active_ || !Trace::on()) return;
  TraceEvent e;
  e.name = std::move(name_);
  e.cat = cat_;
  e.ts_us = t0_;
  e.dur_us = Trace::now_us() - t0_;
  e.tid = Trace::thread_id();
  e.args = std::move(args_);
  if (mem0_ >= 0) {
    const int64_t mem1 = live_tensor_bytes();
    if (!e.args.is_object()) e.args = nlohmann::json::object();
    e.args["tensor_mib_delta"] = static_cast<double>(mem1 - mem0_) / 1048576.0;
    add_memory_sample(e.ts_us + e.dur_us, mem1);
  }
  Trace::add(std::move(e));
}

namespace {

std::vector<std::pair<std::string, double>> sorted(const std::map<std::string, double>& m, size_t keep = 1000) {
  std::vector<std::pair<std::string, double>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (v.size() > keep) v.resize(keep);
  return v;
}

}  // namespace

TraceSummary summarize(const std::vector<TraceEvent>& events, int top_ops) {
  TraceSummary s;
  std::map<std::string, double> phases, modules, comm;
  std::map<int, std::vector<const TraceEvent*>> ops_by_thread;
  for (const TraceEvent& e : events) {
    const double ms = e.dur_us / 1e3;
    if (e.cat == "phase") {
      if (e.name == "step") {
        s.steps_ms += ms;
        ++s.steps;
      } else {
        phases[e.name] += ms;
      }
    } else if (e.cat == "module") {
      const std::string type = e.args.is_object() && e.args.contains("type") ? e.args["type"].get<std::string>() : e.name;
      const std::string pass = e.args.is_object() && e.args.contains("pass") ? e.args["pass"].get<std::string>() : "forward";
      modules[type + " " + pass] += ms;
    } else if (e.cat == "comm") {
      comm[e.name] += ms;
      s.comm_total_ms += ms;
    } else if (e.cat == "op" || e.cat == "op_backward") {
      ops_by_thread[e.tid].push_back(&e);
    }
  }
  // Self time: an operator's duration less that of the operators it called (nested on its thread).
  std::map<std::string, double> self;
  for (auto& [tid, ops] : ops_by_thread) {
    std::sort(ops.begin(), ops.end(), [](const TraceEvent* a, const TraceEvent* b) {
      return a->ts_us != b->ts_us ? a->ts_us < b->ts_us : a->dur_us > b->dur_us;
    });
    std::vector<std::pair<const TraceEvent*, double>> stack;  // event, children's time
    auto close_until = [&](double t) {
      while (!stack.empty() && stack.back().first->ts_us + stack.back().first->dur_us <= t) {
        auto [e, children] = stack.back();
        stack.pop_back();
        self[e->name] += std::max(0.0, e->dur_us - children) / 1e3;
        if (!stack.empty()) stack.back().second += e->dur_us;
      }
    };
    for (const TraceEvent* e : ops) {
      close_until(e->ts_us);
      stack.emplace_back(e, 0.0);
    }
    close_until(1e300);
  }
  s.phases_ms = sorted(phases);
  s.modules_ms = sorted(modules);
  s.comm_ms = sorted(comm);
  s.ops_self_ms = sorted(self, static_cast<size_t>(std::max(0, top_ops)));
  return s;
}

std::string TraceSummary::table() const {
  std::string out;
  char line[256];
  auto pct = [&](double ms) { return steps_ms > 0 ? 100.0 * ms / steps_ms : 0.0; };
  std::snprintf(line, sizeof(line), "profile: %d step(s), %.1f ms in all\n", steps, steps_ms);
  out += line;
  auto section = [&](const char* title, const std::vector<std::pair<std::string, double>>& rows) {
    if (rows.empty()) return;
    std::snprintf(line, sizeof(line), "  %-60s %12s %8s\n", title, "ms", "% step");
    out += line;
    for (const auto& [name, ms] : rows) {
      std::snprintf(line, sizeof(line), "  %-60.60s %12.2f %7.1f%%\n", name.c_str(), ms, pct(ms));
      out += line;
    }
  };
  section("phase", phases_ms);
  section("module (type, pass)", modules_ms);
  section("communication", comm_ms);
  if (!comm_ms.empty()) {
    std::snprintf(line, sizeof(line), "  communication share of the steps: %.1f%%\n", pct(comm_total_ms));
    out += line;
  }
  section("top operators by self time", ops_self_ms);
  if (!parts.empty()) {
    double total = 0;
    for (const Part& p : parts) total += p.tflop;
    std::snprintf(line, sizeof(line), "  %-28s %12s %8s %12s %22s\n", "FLOPs by part", "TFLOP", "share",
                  peak_tflops > 0 ? "MFU (step)" : "TFLOP/s", "TFLOP/s in its blocks");
    out += line;
    for (const Part& p : parts) {
      const double step_rate = steps_ms > 0 ? p.tflop / (steps_ms / 1e3) : 0;
      char mfu[32], blocks[32] = "-";
      if (peak_tflops > 0) std::snprintf(mfu, sizeof(mfu), "%.2f%%", 100 * step_rate / peak_tflops);
      else std::snprintf(mfu, sizeof(mfu), "%.4f", step_rate);
      if (p.block_ms > 0) std::snprintf(blocks, sizeof(blocks), "%.4f", p.tflop / (p.block_ms / 1e3));
      std::snprintf(line, sizeof(line), "  %-28.28s %12.4g %7.1f%% %12s %22s\n", p.name.c_str(), p.tflop,
                    total > 0 ? 100 * p.tflop / total : 0.0, mfu, blocks);
      out += line;
    }
  }
  return out;
}

nlohmann::json TraceSummary::to_json() const {
  auto rows = [](const std::vector<std::pair<std::string, double>>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& [name, ms] : v) a.push_back({{"name", name}, {"ms", ms}});
    return a;
  };
  nlohmann::json by_part = nlohmann::json::array();
  for (const Part& p : parts) {
    nlohmann::json j = {{"name", p.name}, {"tflop", p.tflop}, {"block_ms", p.block_ms}};
    if (steps_ms > 0 && peak_tflops > 0) j["mfu"] = p.tflop / (steps_ms / 1e3) / peak_tflops;
    by_part.push_back(j);
  }
  return {{"steps", steps},           {"steps_ms", steps_ms},   {"phases", rows(phases_ms)},
          {"modules", rows(modules_ms)}, {"comm", rows(comm_ms)}, {"comm_ms", comm_total_ms},
          {"top_ops", rows(ops_self_ms)}, {"parts", by_part},    {"peak_tflops", peak_tflops}};
}

}  // namespace mm::tools
