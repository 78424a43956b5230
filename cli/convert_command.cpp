// `mm convert`: checkpoints between Hugging Face directories, mm's (sharded, any layout) folders
// and other layouts, streamed tensor by tensor (mindspeed_mm/checkpoint/convert.h).
//   mm convert hf-to-mm --model-type qwen2_vl --in HF_DIR --out DIR --tp 2 --pp 2
//   mm convert mm-to-hf --in save/iter_0000100 --out HF_DIR
//   mm convert resplit --in DIR --out DIR2 --tp 1 --pp 4
#include <malloc.h>

#include <cstdio>

#include <yaml-cpp/yaml.h>

#include "cli/commands.h"
#include "mindspeed_mm/checkpoint/convert.h"
#include "mindspeed_mm/config/config_io.h"
#include "mindspeed_mm/core/errors.h"

namespace mm::cli {
namespace {

struct ConvertArgs {
  std::string model_type, in, out, pipeline_num_layers, dtype = "keep", copy_from, base, adapter;
  int tp = 1, pp = 1, dp = 1, vpp = 1;
  double max_shard_gb = 5;
  bool quiet = false;
  checkpoint::WanConvertOptions wan;
} args;

checkpoint::ConvertLayout layout() {
  checkpoint::ConvertLayout l;
  l.tp = args.tp;
  l.pp = args.pp;
  l.dp = args.dp;
  l.vp = args.vpp;
  if (!args.pipeline_num_layers.empty()) {
    try {
      l.pipeline_num_layers = config::yaml_to_json(YAML::Load(args.pipeline_num_layers));
    } catch (const YAML::Exception& e) {
      throw ConfigError(cat("convert: --pipeline-num-layers '", args.pipeline_num_layers,
                            "' is not YAML/JSON such as {text: [2, 2]} (", e.what(), ")"));
    }
  }
  return l;
}

checkpoint::ConvertOptions options() {
  // Conversion frees every tensor right after writing it: glibc gives the memory back at once
  // (the training allocator settings keep it cached, core/allocator.h).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
  checkpoint::ConvertOptions o;
  o.dtype = args.dtype;
  o.max_shard_bytes = static_cast<uint64_t>(args.max_shard_gb * (1ull << 30));
  o.progress = !args.quiet;
  o.copy_from = args.copy_from;
  return o;
}

void report(const char* what, const checkpoint::ConvertSummary& s, const std::string& extra) {
  std::printf("%s: wrote %lld tensors (%.3f GB) in %d files to %s%s; peak memory %.0f MB\n", what,
              static_cast<long long>(s.tensors), static_cast<double>(s.bytes) / 1e9, s.files, args.out.c_str(),
              extra.c_str(), static_cast<double>(checkpoint::peak_rss_bytes()) / 1e6);
}

void add_layout_options(CLI::App* c) {
  c->add_option("--tp", args.tp, "tensor-parallel size (the model's TP plan cuts each tensor)");
  c->add_option("--pp", args.pp, "pipeline-parallel stages");
  c->add_option("--vpp", args.vpp, "virtual pipeline chunks per stage (interleaved 1F1B)");
  c->add_option("--dp", args.dp, "data-parallel shards (FSDP ranges of each tensor)");
  c->add_option("--pipeline-num-layers", args.pipeline_num_layers,
                "layers per stage by submodule, as parallel.pipeline_num_layers: '{vision: [2, 0], text: [1, 3]}'");
}

void add_common_options(CLI::App* c) {
  c->add_option("--dtype", args.dtype, "written dtype of floating-point tensors")
      ->check(CLI::IsMember({"keep", "fp32", "bf16", "fp16"}));
  c->add_flag("--quiet", args.quiet, "no progress bar");
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto* c = app.add_subcommand("convert", "Convert checkpoints: HF <-> mm layouts, resplit, Wan2.1 names");
  c->require_subcommand(1);
  c->footer(
      "Outputs are written under OUT.partial and renamed when complete; an existing non-empty OUT is refused.\n"
      "Memory stays near the largest tensor (streamed). Exit codes: 0 done, 1 bad input, 2 a layout that does not fit.");

  auto* h = c->add_subcommand("hf-to-mm", "An HF model directory -> a checkpoint split for a parallel layout");
  h->add_option("--model-type", args.model_type, "model id (qwen2, qwen2_vl, qwen2_5_vl, llava, wan_dit); default: config.json's");
  h->add_option("--in", args.in, "HF model directory (config.json + safetensors)")->required();
  h->add_option("--out", args.out, "output checkpoint folder")->required();
  add_layout_options(h);
  add_common_options(h);
  register_action(h, [] {
    const auto l = layout();
    report("hf-to-mm", checkpoint::convert_hf_to_mm(args.model_type, args.in, args.out, l, options()), ", " + l.describe());
    return 0;
  });

  auto* m = c->add_subcommand("mm-to-hf", "A checkpoint folder of any layout -> an HF model directory");
  m->add_option("--in", args.in, "checkpoint folder (save/iter_XXXXXXX) or save dir (its latest)")->required();
  m->add_option("--out", args.out, "output HF directory")->required();
  m->add_option("--max-shard-gb", args.max_shard_gb, "safetensors shard size in GB (HF's default 5)");
  m->add_option("--copy-from", args.copy_from, "also copy tokenizer/processor files from this directory");
  add_common_options(m);
  register_action(m, [] {
    report("mm-to-hf", checkpoint::convert_mm_to_hf(args.in, args.out, options()), "");
    return 0;
  });

  auto* r = c->add_subcommand("resplit", "A checkpoint folder -> the same checkpoint in another layout");
  r->add_option("--in", args.in, "checkpoint folder or save dir (its latest)")->required();
  r->add_option("--out", args.out, "output checkpoint folder")->required();
  add_layout_options(r);
  add_common_options(r);
  register_action(r, [] {
    const auto l = layout();
    report("resplit", checkpoint::resplit_checkpoint(args.in, args.out, l, options()), ", " + l.describe());
    return 0;
  });

  auto* ml = c->add_subcommand("merge-lora", "A PEFT LoRA adapter merged into its base model (an HF directory)");
  ml->add_option("--base", args.base, "the base HF model directory")->required();
  ml->add_option("--adapter", args.adapter, "PEFT adapter directory (adapter_config.json + adapter_model.safetensors)")
      ->required();
  ml->add_option("--out", args.out, "output HF directory")->required();
  ml->add_option("--max-shard-gb", args.max_shard_gb, "safetensors shard size in GB (HF's default 5)");
  add_common_options(ml);
  register_action(ml, [] {
    report("merge-lora", checkpoint::merge_lora(args.base, args.adapter, args.out, options()), "");
    return 0;
  });

  auto* w = c->add_subcommand("wan", "Wan2.1 checkpoints between the original release's layout and diffusers'");
  w->add_option("--from", args.wan.from, "original or diffusers")->required()->check(CLI::IsMember({"original", "diffusers"}));
  w->add_option("--to", args.wan.to, "diffusers or original")->required()->check(CLI::IsMember({"original", "diffusers"}));
  w->add_option("--in", args.in, "input directory (original: config.json, safetensors, Wan2.1_VAE.pth, models_t5_*.pth, "
                                 "google/umt5-xxl/; diffusers: a pipeline directory)")->required();
  w->add_option("--out", args.out, "output directory")->required();
  w->add_option("--vae-config", args.wan.vae_config, "original -> diffusers: the VAE's diffusers config.json (default Wan2.1's)");
  w->add_option("--text-encoder-config", args.wan.text_encoder_config,
                "original -> diffusers: umT5's config.json (default: read from the tensors)");
  w->add_option("--flow-shift", args.wan.flow_shift, "original -> diffusers: the scheduler's flow_shift (3.0 480p, 5.0 720p)");
  w->add_option("--max-shard-gb", args.max_shard_gb, "safetensors shard size in GB");
  add_common_options(w);
  register_action(w, [] {
    checkpoint::WanConvertOptions o = args.wan;
    static_cast<checkpoint::ConvertOptions&>(o) = options();
    std::vector<std::string> parts;
    const auto s = checkpoint::convert_wan(args.in, args.out, o, &parts);
    std::string list;
    for (const auto& p : parts) list += (list.empty() ? "" : ", ") + p;
    report("wan", s, cat(" (", o.from, " -> ", o.to, ": ", list, ")"));
    return 0;
  });
}

}  // namespace mm::cli
