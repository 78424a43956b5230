// A Chrome-trace recorder (the Trace Event Format that Perfetto and chrome://tracing open) for
// `tools.profile`: complete events ("ph": "X") for the training step's phases, each block's
// forward and backward, every collective (bytes, wait time) and, through ATen's RecordFunction
// callbacks, every operator (shapes when asked). Recording is off unless a profile window is
// open; a TraceScope then costs one relaxed atomic load.
//
//   {"traceEvents": [{"name": "forward", "cat": "phase", "ph": "X", "ts": 12.5, "dur": 80.1,
//                     "pid": 0, "tid": 1, "args": {...}}, ...], "displayTimeUnit": "ms"}
//
// ts and dur are microseconds since the window opened; pid is the rank, tid a small number per
// thread (named by metadata events).
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <functional>
#include <string>
#include <vector>

namespace mm::tools {

struct TraceEvent {
  char ph = 'X';  // 'X': a complete event; 'C': a counter sample (args: {"MiB": live tensors})
  std::string name;
  std::string cat;  // phase | module | comm | op
  double ts_us = 0, dur_us = 0;
  int tid = 0;
  nlohmann::json args;  // null or an object
};

class Trace {
 public:
  static bool on() { return on_.load(std::memory_order_relaxed); }
  // Opens a window: clears what was recorded, installs the operator callbacks.
  static void start(bool record_shapes, bool with_stack);
  // Closes the window; the events stay until the next start.
  static void stop();
  static double now_us();  // since the window opened
  static void add(TraceEvent e);
  static std::vector<TraceEvent> events();
  // Writes the Chrome trace (mm::Error naming the file on failure), atomically.
  static void write(const std::string& path, int rank);
  // The enclosing module ranges of this thread ("model.layers.3"), innermost last.
  static std::vector<std::string>& module_stack();
  static int thread_id();
  // Names a tid of events added from elsewhere (Kineto's CUDA streams) in the written trace.
  static void name_thread(int tid, std::string name);
  // Live tensor bytes on the training device (set by the profile window; none: no memory track).
  // Phase and module ranges then carry their change of it ("tensor_mib_delta": a block's forward
  // leaves what backward will need) and a "tensor memory" counter track is sampled at their ends.
  static void set_memory_source(std::function<int64_t()> source);

 private:
  static std::atomic<bool> on_;
};

// Records [construction, destruction) as one complete event while a window is open.
class TraceScope {
 public:
  TraceScope(const char* name, const char* cat, nlohmann::json args = nullptr);
  TraceScope(std::string name, const char* cat, nlohmann::json args = nullptr);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  bool active_;
  std::string name_;
  const char* cat_;
  nlohmann::json args_;
  double t0_ = 0;
  int64_t mem0_ = -1;
};

// The end-of-window summary: time by phase, by module type (the name before the path, e.g.
// "Qwen2DecoderLayer"), communication's share of the steps, and the top operators by self time.
struct TraceSummary {
  std::vector<std::pair<std::string, double>> phases_ms, modules_ms, ops_self_ms, comm_ms;
  double steps_ms = 0, comm_total_ms = 0;
  int steps = 0;
  // FLOPs by model part over the window (filled by the caller, which knows the model): each part's
  // share of MFU over the steps' time, and its rate over its own blocks' ranges (forward and
  // backward; 0 when the part has no block, as a projector).
  struct Part {
    std::string name;
    double tflop = 0, block_ms = 0;
  };
  std::vector<Part> parts;
  double peak_tflops = 0;  // 0: MFU unknown (tools.peak_tflops or a known GPU)
  std::string table() const;  // printable, one row per line
  nlohmann::json to_json() const;
};
TraceSummary summarize(const std::vector<TraceEvent>& events, int top_ops = 10);

}  // namespace mm::tools
