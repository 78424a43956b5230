#include "cli/commands.h"

#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#ifdef MM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <cstdio>
#include <functional>
#include <iostream>
#include <map>

#include <filesystem>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/config/megatron_flags.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/torch_compat.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/inference/model_loader.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/tools/peak_flops.h"
#include "mindspeed_mm/training/trainer.h"

namespace mm::cli {
namespace {

std::map<CLI::App*, std::function<int()>>& actions() {
  static std::map<CLI::App*, std::function<int()>> a;
  return a;
}

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  bool print_config = false;
} train_args;

struct ExportArgs {
  std::string checkpoint, out;
  double max_shard_gb = 5;
} export_args;

struct BenchArgs {
  int64_t size = 1024;
  int reps = 5;
  std::string dtype = "fp32";
  std::string device = "auto";
} bench_args;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "--tensor-model-parallel-size N (parallel.tensor_parallel_size), ..."
std::string megatron_flag_help() {
  std::string s;
  for (const auto& f : config::megatron_flags())
    s += cat(s.empty() ? "" : ", ", f.flag, f.fixed ? "" : " N", " (", f.key, f.fixed ? cat("=", f.fixed) : "", ")");
  return s;
}

}  // namespace

void register_action(CLI::App* cmd, std::function<int()> fn) { actions()[cmd] = std::move(fn); }

std::string version_text() {
  std::string s = "mm 0.1.0\nlibtorch " + compat::torch_version();
#ifdef MM_WITH_CUDA
  s += "\ncuda: compiled in (CUDA " +
       std::to_string(CUDA_VERSION / 1000) + "." + std::to_string(CUDA_VERSION / 10 % 100) + ")";
  const int64_t n = at::detail::getCUDAHooks().hasCUDA() ? at::detail::getCUDAHooks().deviceCount() : 0;
  s += "\ncuda devices: " + std::to_string(n);
  for (int64_t i = 0; i < n; ++i) {
    const auto* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(i));
    s += "\n  cuda:" + std::to_string(i) + " " + p->name + ", " + std::to_string(p->totalGlobalMem >> 30) +
         " GiB, sm_" + std::to_string(p->major) + std::to_string(p->minor);
  }
  if (n == 0) s += " (no driver or GPU visible: everything runs on the CPU)";
#else
  s += "\ncuda: not compiled in (CPU build)";
#endif
  // c10d backends compiled into this libtorch (the distributed runtime builds on them).
  std::string backends;
#if __has_include(<torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>)
  backends += "gloo";
#endif
#if defined(MM_WITH_CUDA) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
  backends += backends.empty() ? "nccl" : ", nccl";
#endif
  s += "\ncollectives (c10d): " + (backends.empty() ? std::string("none") : backends);
  s += "\nscaled_dot_product_attention: libtorch (at::scaled_dot_product_attention)";
  s += "\nintra-op threads: " + std::to_string(at::get_num_threads());
  s += "\nmodels: " + join(models::model_registry().ids());
  s += "\ndatasets: " + join(data::dataset_registry().ids());
  return s;
}

void add_version_command(CLI::App& app) {
  auto* c = app.add_subcommand("version", "Print the version, the libtorch it was built with and build features");
  actions()[c] = [] {
    std::printf("%s\n", version_text().c_str());
    return 0;
  };
}

void add_train_command(CLI::App& app) {
  auto* c = app.add_subcommand("train", "Train a model from a YAML config (FSDP2-style backend)");
  c->add_option("config", train_args.config, "YAML config with sections parallel, data, model, features, training, tools")
      ->required();
  c->add_option("overrides", train_args.overrides, "key.sub=value overrides, e.g. training.optimizer.lr=3e-4");
  c->add_flag("--print-config", train_args.print_config, "Print the resolved config as YAML and exit");
  c->footer(
      "Examples:\n"
      "  mm train examples/qwen2/tiny_fortunes.yaml\n"
      "  mm train examples/qwen2/tiny_fortunes.yaml training.train_iters=50 training.precision=bf16\n"
      "  mm train examples/qwen2/tiny_fortunes.yaml --print-config\n"
      "  mm launch --nproc-per-node 4 -- mm train CONFIG --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2\n"
      "Megatron-LM flags are accepted as overrides: " + megatron_flag_help() + "\n"
      "Exit codes: 0 done, 1 runtime error (data, checkpoint), 2 configuration error.");
  actions()[c] = [] {
    config::Config cfg = config::load_config(train_args.config, train_args.overrides);
    if (train_args.print_config) {
      std::printf("%s", config::to_yaml(cfg).c_str());
      return 0;
    }
    training::train(cfg);
    return 0;
  };
}

void add_export_command(CLI::App& app) {
  auto* c = app.add_subcommand("export", "Write a training checkpoint as a Hugging Face model directory");
  c->add_option("--checkpoint", export_args.checkpoint, "save/iter_XXXXXXX folder, or a save dir (uses its latest)")
      ->required();
  c->add_option("--out", export_args.out, "output directory (config.json + safetensors)")->required();
  c->add_option("--max-shard-gb", export_args.max_shard_gb, "shard size in GB (HF default 5)");
  actions()[c] = [] {
    const uint64_t shard_bytes = static_cast<uint64_t>(export_args.max_shard_gb * (1ull << 30));
    std::string dir = export_args.checkpoint;
    if (!std::filesystem::exists(std::filesystem::path(dir) / "config.json"))
      dir = checkpoint::resolve_resume_dir("auto", dir);
    if (!dir.empty() && std::filesystem::exists(std::filesystem::path(dir) / "metadata.json")) {
      // Sharded (FSDP, ZeRO-1): streamed tensor by tensor, never the whole model in memory.
      checkpoint::CheckpointReader reader(dir);
      checkpoint::export_hf_from_checkpoint(reader, export_args.out, shard_bytes);
      std::printf("exported %s (sharded, %zu tensors) to %s\n", dir.c_str(), reader.names("model").size(),
                  export_args.out.c_str());
      return 0;
    }
    inference::LoadedModel m = inference::load_model(export_args.checkpoint);
    checkpoint::export_hf_directory(export_args.out, m.model->hf_config(), *m.model, shard_bytes);
    std::printf("exported %s (%lld parameters) to %s\n", m.dir.c_str(), static_cast<long long>(m.model->num_parameters()),
                export_args.out.c_str());
    return 0;
  };
}

void add_bench_command(CLI::App& app) {
  auto* c = app.add_subcommand("bench", "Micro-benchmarks of this machine");
  auto* peak = c->add_subcommand("peak", "Measure the dense matmul ceiling (the MFU denominator)");
  peak->add_option("--size", bench_args.size, "matrix side");
  peak->add_option("--reps", bench_args.reps, "repetitions (best is reported)");
  peak->add_option("--dtype", bench_args.dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  peak->add_option("--device", bench_args.device, "auto (a GPU when there is one), cpu, cuda or cuda:N");
  c->require_subcommand(1);
  actions()[peak] = [] {
    auto dt = bench_args.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
    const at::Device device = resolve_device(bench_args.device, 0, "--device");
    set_current_device(device);
    auto r = tools::measure_matmul_peak(bench_args.size, dt, bench_args.reps, device);
    const std::string where = device.is_cuda() ? describe_device(device) : cat(r.threads, " threads");
    std::printf("matmul %lldx%lld %s, %s: %.3f TFLOP/s (set tools.peak_tflops to this for MFU)\n",
                static_cast<long long>(r.size), static_cast<long long>(r.size), bench_args.dtype.c_str(), where.c_str(),
                r.tflops);
    return 0;
  };
}

int run_selected(CLI::App& app) {
  for (auto& [cmd, fn] : actions()) {
    if (cmd->parsed()) {
      bool child_ran = false;
      for (auto* sub : cmd->get_subcommands())
        if (actions().count(sub)) child_ran = true;
      if (!child_ran) return fn();
    }
  }
  return 0;
}

}  // namespace mm::cli
