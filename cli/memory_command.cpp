// `mm memory CONFIG.yaml [overrides]`: each rank's peak tensor memory for the config's layout,
// before any run (training/memory_estimate.h).
#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/training/memory_estimate.h"

namespace mm::cli {
namespace {

struct MemoryArgs {
  std::string config;
  std::vector<std::string> overrides;
  int world = 0;
  int batches = 4;
  std::string json;
} memory_args;

int run_memory() {
  const config::Config cfg = config::load_config(memory_args.config, memory_args.overrides, /*for_training=*/true);
  const training::MemoryEstimate e = training::estimate_memory(cfg, memory_args.world, memory_args.batches);
  std::fputs(training::format_memory_estimate(e).c_str(), stdout);
  if (!memory_args.json.empty()) {
    nlohmann::json j = {{"model", e.model}, {"layout", e.layout}, {"world", e.world}, {"batch", e.batch}, {"notes", e.notes}};
    for (const auto& r : e.ranks) {
      nlohmann::json t = nlohmann::json::object();
      for (const auto& [name, b] : r.terms) t[name] = b;
      j["ranks"].push_back({{"role", r.role}, {"ranks", r.ranks}, {"params", r.params}, {"grads", r.grads},
                            {"optimizer", r.optimizer}, {"data", r.data}, {"activations", r.activations},
                            {"transient", r.transient}, {"peak", r.peak}, {"peak_at", r.peak_at}, {"terms", t}});
    }
    std::ofstream f(memory_args.json);
    if (!(f << j.dump(2) << "\n")) throw Error(cat(memory_args.json, ": cannot write the estimate"));
  }
  return 0;
}

}  // namespace

void add_memory_command(CLI::App& app) {
  auto* c = app.add_subcommand("memory", "Each rank's peak memory for a config's layout (parameters, gradients, "
                                         "optimizer state, activations by schedule), before any run");
  c->add_option("config", memory_args.config, "YAML training config")->required();
  c->add_option("overrides", memory_args.overrides, "key.sub=value overrides (or Megatron flags)");
  c->add_option("--world", memory_args.world, "ranks the layout runs on (default: the product of its degrees)");
  c->add_option("--batches", memory_args.batches, "first micro-batches read for their shapes; the largest counts (4)");
  c->add_option("--json", memory_args.json, "also write the estimate as JSON to this file");
  c->footer("Examples:\n  mm memory examples/qwen2vl/tiny_fashion_mnist.yaml\n"
            "  mm memory examples/qwen2/tiny_fortunes.yaml parallel.tensor_parallel_size=2 --world 2");
  register_action(c, run_memory);
}

}  // namespace mm::cli
