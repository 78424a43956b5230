// Train-step profile of the quickstart's vision-language model (examples/qwen2vl/
// tiny_fashion_mnist.yaml) through the real pipeline: the threaded mllm loader (image decode,
// Qwen2-VL processor, chat template, collator), the model, AdamW, stepped by
// mm::training::train_step() as `mm train` steps.
// Per step it measures
//   loader  the time the step waited for its batch (0 when the loader keeps ahead)
//   step    forward + loss + backward + clip + AdamW + zero_grad
// and, on the same batch outside the step, the vision tower alone (forward, and backward of a
// fixed upstream gradient): the tower's share of the step; the language model (with the loss
// and optimizer) is the rest. Throughput: real input tokens per second; achieved FLOP/s from
// Model::training_flops (decoder plus tower); MFU against this machine's dense matmul
// ceiling measured in the same run (mm bench peak's method), so the ratio is self-contained.
//
// On a GPU (training.device auto | cuda, or the DEVICE argument) the step runs there, timed to
// its completion, with bf16 autocast when training.precision is bf16. MM_BENCH_DUMP=DIR writes
// the model's config.json and every timed batch (batch_K.safetensors) so that
// bench/gpu/vl_step_hf.py can time Hugging Face transformers on exactly the same batches.
//
//   usage: vl_step CONFIG DATA_DIR [steps] [warmup] [intra-op threads] [device] [config overrides...]
//   prints one `RESULT ...` line plus a table
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/models/qwen2vl/qwen2vl.h"
#include "mindspeed_mm/tools/peak_flops.h"
#include "mindspeed_mm/training/model_builder.h"
#include "mindspeed_mm/training/train_step.h"

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: vl_step CONFIG DATA_DIR [steps] [warmup] [threads]\n");
    return 2;
  }
  mm::configure_host_allocator();
  const std::string data_dir = argv[2];
  const int steps = argc > 3 ? std::atoi(argv[3]) : 40, warmup = argc > 4 ? std::atoi(argv[4]) : 5;
  if (argc > 5 && std::atoi(argv[5]) > 0) at::set_num_threads(std::atoi(argv[5]));
  try {
    std::vector<std::string> overrides = {"data.paths=[" + data_dir + "/train.jsonl]", "data.val_paths=[]",
                                          "data.val_fraction=0"};
    for (int i = 7; i < argc; ++i) overrides.push_back(argv[i]);
    mm::config::Config cfg = mm::config::load_config(argv[1], overrides);
    const auto& tc = cfg.training;
    const at::Device device = mm::resolve_device(argc > 6 ? argv[6] : tc.device, 0, "device");
    mm::set_current_device(device);
    const bool bf16 = tc.precision == "bf16";
    const char* dump = std::getenv("MM_BENCH_DUMP");
    mm::data::DataContext dctx;
    dctx.micro_batch_size = tc.micro_batch_size;
    mm::data::TrainData data = mm::data::dataset_registry().get(cfg.data.dataset)(cfg.data, dctx);
    at::manual_seed(static_cast<uint64_t>(tc.seed));
    auto model = mm::training::build_model(cfg.model, data.vocab_size, static_cast<uint64_t>(tc.seed), nullptr, false, device);
    if (dump) {
      std::filesystem::create_directories(dump);
      mm::st::write_file_atomic(std::string(dump) + "/config.json", model->hf_config().dump(2) + "\n");
    }
    auto* vl = dynamic_cast<mm::models::Qwen2VLForConditionalGeneration*>(model.get());
    if (!vl) throw mm::Error("vl_step: the config's model is not qwen2_vl / qwen2_5_vl");
    // One process: the data-parallel layer, objective and optimizer as `mm train` sets them up.
    mm::training::TrainParallel par(cfg.parallel, mm::parallel::DistEnv{}, device);
    mm::training::DataParallelModel dp(*model, par, cfg.parallel, device);
    auto objective = mm::training::make_objective(cfg, *model);
    auto opt = mm::training::optimizer_registry().get(tc.optimizer.id)(dp.param_groups({}), tc.optimizer);
    mm::training::StepEnv env{*model, *objective, dp, *opt, par, bf16, tc.clip_grad};

    double t_loader = 0, t_step = 0, t_vision = 0, flops = 0, tokens = 0;
    int64_t samples = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      const bool timed = s >= warmup;
      auto t0 = Clock::now();
      mm::data::Batch host = data.train->next();
      const double wait = since(t0);
      if (dump && timed) {
        std::vector<std::pair<std::string, at::Tensor>> t;
        for (auto f : {mm::data::kInputIds, mm::data::kLabels, mm::data::kAttentionMask, mm::data::kPixelValues,
                       mm::data::kImageGridThw})
          t.emplace_back(std::string(f), host[f]);
        mm::st::save_safetensors(std::string(dump) + "/batch_" + std::to_string(s - warmup) + ".safetensors", t);
      }
      auto t1 = Clock::now();
      const mm::training::MicroBatch mb{host, mm::data::batch_to_device(host, device)};
      mm::training::train_step(env, {mb}, tc.optimizer.lr, s);
      mm::synchronize(device);
      const double step = since(t1);
      // The tower alone on the same batch: forward, and backward of a fixed upstream gradient.
      auto t2 = Clock::now();
      {
        at::Tensor f;
        {
          mm::training::AutocastScope autocast(bf16, device.type());
          f = vl->visual->forward(mb.device[mm::data::kPixelValues], mb.device[mm::data::kImageGridThw]);
        }
        f.backward(at::ones_like(f));
      }
      mm::synchronize(device);
      const double vision = since(t2);
      opt->zero_grad();
      if (!timed) continue;
      t_loader += wait;
      t_step += step;
      t_vision += vision;
      flops += model->training_flops(host);
      tokens += model->input_tokens(host);
      samples += host.num_samples;
    }
    const auto peak = device.is_cuda() ? mm::tools::measure_matmul_peak(8192, bf16 ? at::kBFloat16 : at::kFloat, 5, device)
                                       : mm::tools::measure_matmul_peak(1024, at::kFloat, 5);
    const double wall = t_loader + t_step;
    const double tflops = flops / t_step / 1e12;
    std::printf("vl_step: %s, batch %lld, %d timed steps after %d warm-up, %s, %d intra-op thread(s), %lld loader workers\n",
                argv[1], static_cast<long long>(tc.micro_batch_size), steps, warmup, mm::describe_device(device).c_str(),
                at::get_num_threads(), static_cast<long long>(cfg.data.num_workers));
    std::printf("%-34s %10.1f\n", "step time (ms, loader wait excluded)", 1e3 * t_step / steps);
    std::printf("%-34s %10.1f\n", "  vision tower fwd+bwd (ms)", 1e3 * t_vision / steps);
    std::printf("%-34s %10.1f\n", "  language model + loss + AdamW (ms)", 1e3 * (t_step - t_vision) / steps);
    std::printf("%-34s %10.2f\n", "loader wait per step (ms)", 1e3 * t_loader / steps);
    std::printf("%-34s %10.0f\n", "input tokens / s", tokens / wall);
    std::printf("%-34s %10.1f\n", "samples / s", static_cast<double>(samples) / wall);
    std::printf("%-34s %10.4f\n", "achieved TFLOP/s", tflops);
    std::printf("%-34s %10.4f\n", "matmul peak TFLOP/s (same run)", peak.tflops);
    std::printf("%-34s %9.2f%%\n", "MFU", 100 * tflops / peak.tflops);
    std::printf("%-34s %9.1f%% / %.1f%% / %.1f%%\n", "share vision / LM / loader", 100 * t_vision / wall,
                100 * (t_step - t_vision) / wall, 100 * t_loader / wall);
    std::printf("RESULT impl=mm tokens_per_s=%.1f samples_per_s=%.2f step_ms=%.2f vision_ms=%.2f loader_wait_ms=%.3f "
                "tflops=%.5f peak_tflops=%.4f mfu=%.5f\n",
                tokens / wall, static_cast<double>(samples) / wall, 1e3 * t_step / steps, 1e3 * t_vision / steps,
                1e3 * t_loader / steps, tflops, peak.tflops, tflops / peak.tflops);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vl_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
