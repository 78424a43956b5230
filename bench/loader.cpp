// Loader throughput: samples/s of mm's DataLoader (decode, Qwen2-VL smart_resize + bicubic
// resize, normalize, patchify, chat template + byte tokenizer, collate) on an mllm JSONL of real
// media, with 1 and 2 worker threads; and the rate at which the trainer consumes batches of the
// same data on the quickstart model (examples/qwen2/tiny_fortunes.yaml sizes, vocab of the byte
// chat tokenizer): forward, backward, clip, AdamW, as trainer.cpp does a step.
// bench/loader_baseline.py does the same per-sample work in Python (PIL, numpy, torchvision);
// bench/run_loader.sh prepares the data, runs both and prints the ratios.
//
// Output lines:
//   RESULT impl=mm kind=K workers=W samples_per_s=X
//   RESULT impl=mm-train kind=K batch=B samples_per_s=X step_ms=Y fed_samples_per_s=Z
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/loader.h"
#include "mindspeed_mm/data/mllm/mllm_collator.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/mllm_options.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/training/optimizer.h"
#include "mindspeed_mm/training/model_builder.h"
#include "mindspeed_mm/training/train_step.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Args {
  std::string data, kind = "images", quickstart = "examples/qwen2/tiny_fortunes.yaml";
  int64_t samples = 200, warmup = 4, train_batch = 4, train_steps = 10, max_pixels = 28 * 28 * 1280;
  double fps = 2.0;
};

std::unique_ptr<mm::data::DataLoader> make_loader(const std::vector<mm::data::MllmRecord>& recs,
                                                  const mm::data::SampleEncoder& enc, int workers, int64_t batch) {
  mm::data::CollatorOptions co{false, 8, enc.pad_id()};
  mm::data::LoaderOptions lo;
  lo.batch_size = batch;
  lo.num_workers = workers;
  lo.prefetch = 2 * workers + 2;
  return std::make_unique<mm::data::DataLoader>(
      static_cast<int64_t>(recs.size()), [&](int64_t i) { return enc.encode(recs[static_cast<size_t>(i)]); },
      [co](const std::vector<mm::data::EncodedSample>& s) { return mm::data::collate_samples(s, co); },
      mm::data::ResumableSampler(static_cast<int64_t>(recs.size()), 1, true), lo);
}

int run(const Args& a) {
  mm::data::MllmFile f = mm::data::read_mllm_file(a.data);
  MM_CHECK(!f.records.empty() && f.bad.empty(), "loader bench: ", a.data, " has ", f.records.size(), " records and ",
           f.bad.size(), " bad ones");
  mm::config::DataConfig dc;
  dc.processor.max_pixels = a.max_pixels;
  dc.processor.fps = a.fps;
  dc.cutoff_len = 1 << 16;  // measure whole samples: long videos are not cut
  const mm::data::SampleEncoder enc(mm::data::mllm_tokenizer(dc), mm::data::encoder_options(dc));

  for (int workers : {1, 2}) {
    auto loader = make_loader(f.records, enc, workers, 1);
    for (int64_t i = 0; i < a.warmup; ++i) loader->next();
    auto t0 = Clock::now();
    for (int64_t i = 0; i < a.samples; ++i) loader->next();
    const double dt = seconds_since(t0);
    std::printf("RESULT impl=mm kind=%s workers=%d samples_per_s=%.2f\n", a.kind.c_str(), workers, a.samples / dt);
    std::fflush(stdout);
  }

  // Consumption: the quickstart model trained on this data's batches.
  mm::config::Config qc = mm::config::load_config(a.quickstart, {});
  auto model = mm::training::build_model(qc.model, enc.tokenizer().vocab_size(), 42);
  mm::training::TrainParallel par(qc.parallel, mm::parallel::DistEnv{});
  mm::training::DataParallelModel dp(*model, par, qc.parallel);
  auto objective = mm::training::make_objective(qc, *model);
  auto opt = mm::training::optimizer_registry().get("adamw", "optimizer")(dp.param_groups({}), qc.training.optimizer);
  mm::training::StepEnv env{*model, *objective, dp, *opt, par, false, 1.0};
  auto loader = make_loader(f.records, enc, 2, a.train_batch);
  double step_total = 0;
  auto fed0 = Clock::now();
  for (int64_t s = 0; s < a.warmup + a.train_steps; ++s) {
    if (s == a.warmup) fed0 = Clock::now(), step_total = 0;
    mm::data::Batch b = loader->next();
    auto t0 = Clock::now();
    mm::training::train_step(env, {{b, b}}, 1e-3, s);
    step_total += seconds_since(t0);
  }
  const double fed = seconds_since(fed0);
  std::printf("RESULT impl=mm-train kind=%s batch=%lld samples_per_s=%.2f step_ms=%.1f fed_samples_per_s=%.2f\n",
              a.kind.c_str(), static_cast<long long>(a.train_batch), a.train_batch * a.train_steps / step_total,
              1e3 * step_total / a.train_steps, a.train_batch * a.train_steps / fed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  mm::configure_host_allocator();
  Args a;
  std::map<std::string, int64_t*> ints = {{"--samples", &a.samples},         {"--warmup", &a.warmup},
                                          {"--train-batch", &a.train_batch}, {"--train-steps", &a.train_steps},
                                          {"--max-pixels", &a.max_pixels}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (ints.count(k)) *ints[k] = std::stoll(v);
    else if (k == "--data") a.data = v;
    else if (k == "--kind") a.kind = v;
    else if (k == "--quickstart") a.quickstart = v;
    else if (k == "--fps") a.fps = std::stod(v);
    else {
      std::fprintf(stderr, "loader: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader: %s\n", e.what());
    return 1;
  }
}
