// `mm memory CONFIG.yaml [overrides]`: each rank's peak tensor memory for the config's layout,
// before any run (training/memory_estimate.h).
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/training/memory_estimate.h"

namespace mm::cli {
namespace {

struct MemoryArgs {
  std::string config;
  std::vector<std::string> overrides;
  training::MemoryOptions opt;
  std::string json;
  double fit_gib = 0;
} memory_args;

// The largest peak over the ranks.
int64_t worst_peak(const training::MemoryEstimate& e) {
  int64_t p = 0;
  for (const auto& r : e.ranks) p = std::max(p, r.peak);
  return p;
}

// --fit: the longest row (a multiple of 256 tokens) whose every rank's peak stays within the
// budget, by bisection over --seq-len.
int run_fit(const config::Config& cfg) {
  const auto budget = static_cast<int64_t>(memory_args.fit_gib * (1LL << 30));
  training::MemoryOptions opt = memory_args.opt;
  std::shared_ptr<models::Model> model;
  opt.model_cache = &model;
  auto peak_at = [&](int64_t tokens) {
    opt.seq_len = tokens;
    return training::estimate_memory(cfg, opt);
  };
  const int64_t step = 256, cap = int64_t(1) << 24;
  int64_t first = step;  // the shortest row that holds the images' tokens
  int64_t first_peak = 0;
  for (;;) {
    try {
      first_peak = worst_peak(peak_at(first));
      break;
    } catch (const training::RowTooShort&) {
      if (first >= cap) throw;
      first += step;
    }
  }
  if (first_peak > budget) {
    std::printf("%s: even %lld tokens per row need more than %s GiB per rank\n", memory_args.config.c_str(),
                static_cast<long long>(first), log::fixed(memory_args.fit_gib, 1).c_str());
    return 1;
  }
  int64_t lo = first, hi = first;  // lo fits; hi is the first tried that does not (or the cap)
  while (hi < cap && worst_peak(peak_at(hi)) <= budget) lo = hi, hi *= 2;
  while (hi - lo > step) {
    const int64_t mid = (lo + hi) / 2 / step * step;
    if (worst_peak(peak_at(mid)) <= budget) lo = mid;
    else hi = mid;
  }
  const training::MemoryEstimate e = peak_at(lo);
  std::printf("longest sequence within %s GiB per rank: %lld tokens per row (%s; peak %s GiB)\n",
              log::fixed(memory_args.fit_gib, 1).c_str(), static_cast<long long>(lo), e.layout.c_str(),
              log::fixed(static_cast<double>(worst_peak(e)) / (1LL << 30), 2).c_str());
  if (lo >= cap) std::printf("note: stopped at the search's cap of %lld tokens\n", static_cast<long long>(cap));
  if (!memory_args.json.empty()) {
    std::ofstream f(memory_args.json);
    const nlohmann::json j = {{"layout", e.layout}, {"world", e.world}, {"budget_bytes", budget}, {"longest_seq_len", lo},
                              {"peak", worst_peak(e)}};
    if (!(f << j.dump(2) << "\n")) throw Error(cat(memory_args.json, ": cannot write the estimate"));
  }
  return 0;
}

int run_memory() {
  // With --seq-len the data is not opened (full-size configs whose data is elsewhere).
  const bool synthetic = memory_args.opt.seq_len > 0 || memory_args.fit_gib > 0;
  const config::Config cfg = config::load_config(memory_args.config, memory_args.overrides, /*for_training=*/!synthetic);
  if (memory_args.fit_gib > 0) return run_fit(cfg);
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
  c->add_option("--fit", memory_args.fit_gib,
                "GiB per rank: print the longest sequence (tokens per row, as --seq-len) whose peak stays within it");
  c->footer("Examples:\n  mm memory examples/qwen2vl/tiny_fashion_mnist.yaml\n"
            "  mm memory examples/qwen2/tiny_fortunes.yaml parallel.tensor_parallel_size=2 --world 2\n"
            "  mm memory examples/qwen2vl/qwen2vl_7b.yaml --world 8 --seq-len 2048 --images 1 --image-height 672 --image-width 672\n"
            "  mm memory examples/qwen2/qwen2.5_7b.yaml parallel.context_parallel_size=8 parallel.context_parallel_algo=ring --fit 80");
  register_action(c, run_memory);
}

}  // namespace mm::cli
