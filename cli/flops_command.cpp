// `mm flops CONFIG.yaml [overrides]`: a model's parameter count by part and its training FLOPs,
// from the config alone (no weights are allocated, so full-size models size on a laptop).
#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/qwen2vl_image_processor.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/training/model_builder.h"

namespace mm::cli {
namespace {

struct FlopsArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t seq_len = 0;
  int64_t image_height = 0, image_width = 0;
} flops_args;

std::string grouped(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

// v in the largest of `units` (scale, suffix) it reaches, three significant digits: 2.21B, 665M.
std::string scaled(double v, std::initializer_list<std::pair<double, const char*>> units, const char* fallback) {
  double x = v;
  const char* unit = fallback;
  for (const auto& [scale, name] : units)
    if (v >= scale) {
      x = v / scale;
      unit = name;
      break;
    }
  char b[48];
  std::snprintf(b, sizeof b, x >= 100 ? "%.0f%s" : x >= 10 ? "%.1f%s" : "%.2f%s", x, unit);
  return b;
}

std::string short_count(double v) { return scaled(v, {{1e9, "B"}, {1e6, "M"}, {1e3, "K"}}, ""); }
std::string flops_text(double f) {
  return scaled(f, {{1e12, " TFLOP"}, {1e9, " GFLOP"}, {1e6, " MFLOP"}}, " FLOP");
}

int run_flops() {
  config::Config cfg = config::load_config(flops_args.config, flops_args.overrides, /*for_training=*/false);  // reads no data
  bool strict = true;
  // Full-size configs name their vocabulary: without one (null, or 0 for "the tokenizer's"), the
  // model family's own check names the key it needs.
  nlohmann::json hf = training::resolve_hf_config(cfg.model, 0, &strict);
  if (hf.contains("vocab_size") && (hf["vocab_size"].is_null() || hf["vocab_size"] == 0)) hf.erase("vocab_size");
  const models::ModelSize size = models::model_size_registry().get(cfg.model.id, "model.id")(
      hf, "model.config in " + flops_args.config, strict);
  std::printf("model: %s (%s)\n", cfg.model.id.c_str(), flops_args.config.c_str());
  std::printf("parameters:\n");
  for (const auto& [part, n] : size.parts)
    std::printf("  %-28s %16s  (%s)\n", part.c_str(), grouped(n).c_str(), short_count(static_cast<double>(n)).c_str());
  std::printf("  %-28s %16s  (%s)\n", "total", grouped(size.total()).c_str(), short_count(static_cast<double>(size.total())).c_str());
  const int64_t seq = flops_args.seq_len > 0 ? flops_args.seq_len : (cfg.data.dataset == "mllm" ? cfg.data.cutoff_len : cfg.data.seq_len);
  std::printf("training FLOPs (forward + backward):\n");
  if (size.flops_per_token)
    std::printf("  per text token at sequence length %lld: %s\n", static_cast<long long>(seq),
                flops_text(size.flops_per_token(seq)).c_str());
  for (const auto& [what, flops] : size.sample_flops) std::printf("  per %s: %s\n", what.c_str(), flops_text(flops).c_str());
  if (size.image_flops) {
    const auto& p = cfg.data.processor;
    int h = static_cast<int>(flops_args.image_height > 0 ? flops_args.image_height : 448);
    int w = static_cast<int>(flops_args.image_width > 0 ? flops_args.image_width : 448);
    if (p.type == "qwen2vl") {
      std::tie(h, w) = data::smart_resize(h, w, static_cast<int>(p.patch_size * p.merge_size), p.min_pixels, p.max_pixels);
    } else {
      h = w = static_cast<int>(p.image_size);
    }
    std::printf("  per %dx%d image (after the processor's resize): %s\n", w, h, flops_text(size.image_flops(h, w)).c_str());
  }
  return 0;
}

}  // namespace

void add_flops_command(CLI::App& app) {
  auto* c = app.add_subcommand("flops", "Parameter count by part and training FLOPs of a config's model, allocating no weights");
  c->add_option("config", flops_args.config, "YAML config (its model and data sections)")->required();
  c->add_option("overrides", flops_args.overrides, "key.sub=value overrides");
  c->add_option("--seq-len", flops_args.seq_len, "sequence length for the attention term (default: data.cutoff_len / seq_len)");
  c->add_option("--image-height", flops_args.image_height, "image height in pixels before the processor's resize (448)");
  c->add_option("--image-width", flops_args.image_width, "image width in pixels before the processor's resize (448)");
  c->footer("Examples:\n  mm flops examples/qwen2vl/qwen2vl_2b.yaml\n  mm flops examples/qwen2.5vl/qwen2.5vl_7b.yaml --seq-len 8192");
  register_action(c, run_flops);
}

}  // namespace mm::cli
