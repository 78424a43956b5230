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
  training::MemoryOptions opt;
  std::string json;
} memory_args;

int run_memory() {
  // With --seq-len the data is not opened (full-size configs whose data is elsewhere).
  const config::Config cfg =
      config::load_config(memory_args.config, memory_args.overrides, /*for_training=*/memory_args.opt.seq_len == 0);
  const training::MemoryEstimate e = training::estimate_memory(cfg, memory_args.opt);
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
  c->add_option("--world", memory_args.opt.world, "ranks the layout runs on (default: the product of its degrees)");
  c->add_option("--batches", memory_args.opt.batches, "first micro-batches read for their shapes; the largest counts (4)");
  c->add_option("--seq-len", memory_args.opt.seq_len,
                "size micro-batches of this many tokens per row instead of reading the data (full-size configs)");
  c->add_option("--images", memory_args.opt.images, "with --seq-len: images per row (0)");
  c->add_option("--image-height", memory_args.opt.image_height, "with --images: pixels before the processor's resize (448)");
  c->add_option("--image-width", memory_args.opt.image_width, "with --images: pixels before the processor's resize (448)");
  c->add_option("--json", memory_args.json, "also write the estimate as JSON to this file");
  c->footer("Examples:\n  mm memory examples/qwen2vl/tiny_fashion_mnist.yaml\n"
            "  mm memory examples/qwen2/tiny_fortunes.yaml parallel.tensor_parallel_size=2 --world 2\n"
            "  mm memory examples/qwen2vl/qwen2vl_7b.yaml --world 8 --seq-len 2048 --images 1 --image-height 672 --image-width 672");
  register_action(c, run_memory);
}

}  // namespace mm::cli
