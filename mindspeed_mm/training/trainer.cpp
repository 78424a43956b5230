#include "mindspeed_mm/training/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/core/torch_compat.h"
#include "mindspeed_mm/data/text_dataset.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/training/device_batches.h"
#include "mindspeed_mm/training/lr_schedule.h"
#include "mindspeed_mm/training/optimizer.h"
#include "mindspeed_mm/training/plans.h"
#include "mindspeed_mm/training/progress.h"
#include "mindspeed_mm/training/recompute.h"

namespace fs = std::filesystem;

namespace mm::training {
namespace {

// bf16 compute with fp32 weights: autocast for the device's type runs matmuls in bf16 and keeps
// reductions in fp32.
struct AutocastScope {
  AutocastScope(bool on, at::DeviceType type) : on_(on), type_(type) {
    if (on_) compat::set_autocast(type_, true, at::kBFloat16);
  }
  ~AutocastScope() {
    if (on_) {
      compat::set_autocast(type_, false, at::kBFloat16);
      at::autocast::clear_cache();
    }
  }
  bool on_;
  at::DeviceType type_;
};

at::Device model_device(const models::CausalLM& model) {
  for (auto& p : model.parameters()) return p.device();
  return at::kCPU;
}

std::string fmt(double v, int prec = 4) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", prec, v);
  return buf;
}

}  // namespace

nlohmann::json resolve_hf_config(const config::ModelConfig& m, int64_t tokenizer_vocab, bool* strict) {
  nlohmann::json cfg = nlohmann::json::object();
  if (!m.pretrained.empty()) cfg = checkpoint::read_hf_config(m.pretrained);
  else if (!m.config_path.empty()) cfg = checkpoint::read_hf_config(m.config_path);
  // Fields written in our YAML are checked strictly only when they are the whole config; on top
  // of a real config.json the model ignores fields it does not use, as Hugging Face does.
  if (strict) *strict = cfg.empty();
  for (auto& [k, v] : m.config.items()) {
    if (v.is_null()) cfg.erase(k);  // `model.config.key=null` removes a field
    else cfg[k] = v;
  }
  if (!cfg.contains("vocab_size")) cfg["vocab_size"] = tokenizer_vocab;
  if (cfg["vocab_size"].is_number_integer() && cfg["vocab_size"].get<int64_t>() < tokenizer_vocab)
    throw ConfigError(cat("config: model vocab_size ", cfg["vocab_size"].get<int64_t>(),
                          " is smaller than the tokenizer's ", tokenizer_vocab, " ids"));
  return cfg;
}

std::shared_ptr<models::CausalLM> build_model(const config::ModelConfig& m, int64_t tokenizer_vocab, uint64_t seed,
                                              const std::string* source_file, bool deferred, at::Device device) {
  bool strict = false;
  nlohmann::json hf = resolve_hf_config(m, tokenizer_vocab, &strict);
  std::string source = !m.pretrained.empty()    ? m.pretrained + "/config.json"
                       : !m.config_path.empty() ? m.config_path
                                                : "model.config";
  if (source_file && m.pretrained.empty() && m.config_path.empty())
    source += " in " + fs::path(*source_file).filename().string();
  std::shared_ptr<models::CausalLM> model;
  {
    mm::nn::DeferredInitGuard meta;
    model = models::model_registry().get(m.id, "model.id")(hf, source, strict);
  }
  if (deferred) return model;
  mm::nn::materialize(*model, device);
  model->init_weights(seed);
  if (!m.pretrained.empty()) {
    // Tied checkpoints sometimes carry a copy of the embedding as lm_head.weight.
    checkpoint::load_model_weights(*model, m.pretrained, {"lm_head.weight"},
                                   [&](const std::string& k) { return model->parameter_name(k); });
  }
  return model;
}

models::MultimodalInputs batch_inputs(const data::Batch& b) {
  models::MultimodalInputs in;
  in.input_ids = b.input_ids;
  in.position_ids = b.position_ids;
  in.attn_mask = b.segment_ids.defined() ? models::segment_attention_mask(b.segment_ids) : at::Tensor();
  in.attention_mask = b.attention_mask;
  in.segment_ids = b.segment_ids;
  in.pixel_values = b.pixel_values;
  in.image_grid_thw = b.image_grid_thw;
  in.pixel_values_videos = b.pixel_values_videos;
  in.video_grid_thw = b.video_grid_thw;
  in.video_second_per_grid = b.video_second_per_grid;
  return in;
}

models::MultimodalInputs device_inputs(const data::Batch& host, const data::Batch& device_batch) {
  models::MultimodalInputs in = batch_inputs(device_batch);
  if (host.segment_ids.defined() && device_batch.input_ids.is_cuda()) {
    // Packed rows on CUDA: segment boundaries for the varlen flash kernel instead of a [B, 1, S, S] mask.
    auto [cu, longest] = models::packed_cu_seqlens(host.segment_ids);
    in.attn_mask = at::Tensor();
    in.cu_seqlens = to_device(cu, device_batch.input_ids.device());
    in.max_seqlen = longest;
  }
  return in;
}

at::Tensor forward_batch(models::CausalLM& model, const data::Batch& b) { return model.forward_multimodal(batch_inputs(b)); }

double evaluate(models::CausalLM& model, const data::ValPass& val, int64_t batch_size, int64_t max_batches, bool bf16,
                DataParallelModel* dp, const TrainParallel* par) {
  at::NoGradGuard no_grad;
  const at::Device device = model_device(model);
  AutocastScope autocast(bf16, device.type());
  // Summed on the device; read once at the end.
  at::Tensor sum_t = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  at::Tensor count_t = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device));
  const int64_t shard = dp ? dp->eval_shard() : 0, num_shards = dp ? dp->eval_num_shards() : 1;
  val(batch_size, max_batches, shard, num_shards, [&](const data::Batch& host) {
    const data::Batch b = batch_to_device(host, device);
    if (dp) dp->begin_forward();
    at::Tensor logits = model.forward_multimodal(device.is_cpu() ? batch_inputs(b) : device_inputs(host, b)).to(at::kFloat);
    auto ce = models::lm_cross_entropy_sum(logits, b.labels);
    sum_t.add_(ce.sum.to(at::kDouble));
    count_t.add_(ce.count);
  });
  double sum = sum_t.item<double>();
  int64_t count = count_t.item<int64_t>();
  if (dp) dp->end_eval();
  if (par && num_shards > 1) {
    auto total = par->dp_sum({sum, static_cast<double>(count)});
    sum = total[0];
    count = static_cast<int64_t>(total[1]);
  }
  return count > 0 ? sum / count : NAN;
}

std::vector<int64_t> greedy_generate(models::CausalLM& model, std::vector<int64_t> ids, int64_t max_new_tokens,
                                     int64_t eos_id, int64_t max_context) {
  at::NoGradGuard no_grad;
  const at::Device device = model_device(model);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - max_context);
    std::vector<int64_t> window(ids.begin() + start, ids.end());
    at::Tensor input = at::tensor(window, at::kLong).unsqueeze(0).to(device);
    at::Tensor logits = model.forward(input);
    int64_t next = logits[0][-1].argmax().item<int64_t>();
    if (next == eos_id) break;
    ids.push_back(next);
    out.push_back(next);
  }
  return out;
}

TrainSummary train(const config::Config& cfg) {
  // Resident memory before anything of the run exists: libtorch and its CUDA libraries alone
  // are a few hundred MiB, the same for any model; the run's own memory is the peak minus this.
  const int64_t start_rss = [] {
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    return static_cast<int64_t>(resident) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }();
  const auto& tc = cfg.training;
  if (tc.threads > 0) at::set_num_threads(static_cast<int>(tc.threads));
  const parallel::DistEnv env = parallel::DistEnv::from_environment();
  // One device per rank: the launcher's LOCAL_RANK picks it on a multi-GPU node.
  const at::Device device = resolve_device(tc.device, env.local_rank, "training.device");
  set_current_device(device);
  const bool bf16 = tc.precision == "bf16";
  const int64_t seq_len = cfg.data.seq_len;

  // Ids first, so a typo fails before the data is read.
  models::model_registry().get(cfg.model.id, "model.id");
  optimizer_registry().get(tc.optimizer.id, "training.optimizer.id");
  lr_schedule_registry().get(tc.lr_schedule.id, "training.lr_schedule.id");

  // The process group, when a launcher started several ranks; the other ranks stay quiet.
  TrainParallel par(cfg.parallel, env, device);
  if (!par.is_main()) log::set_level(log::Level::kWarn);
  log::info("device: ", describe_device(device), env.distributed() ? cat(" (LOCAL_RANK ", env.local_rank, ")") : "");

  // Data: each data-parallel rank reads its own shard of every global batch.
  data::DataContext data_ctx;
  data_ctx.micro_batch_size = tc.micro_batch_size;
  data_ctx.rank = par.dp_rank();
  data_ctx.world = par.dp_size();
  data::TrainData lm = data::dataset_registry().get(cfg.data.dataset, "data.dataset")(cfg.data, data_ctx);

  // Model, plans, optimizer.
  // The model is built without parameter storage, then materialised on the device; under FSDP
  // each rank materialises only its shards, from the same initialisation or checkpoint, so no
  // rank ever holds the whole model.
  at::manual_seed(static_cast<uint64_t>(tc.seed));
  const bool deferred = par.shape().dp_shard > 1;
  auto model =
      build_model(cfg.model, lm.vocab_size, static_cast<uint64_t>(tc.seed), &cfg.source_file, deferred, device);
  if (!cfg.features.freeze.empty()) {
    int64_t n = apply_freeze_plan(*model, cfg.features.freeze);
    log::info("plan: froze ", n, " parameter tensors");
  }
  // DDP or FSDP before recompute: a unit's FSDP wrapper must be outermost, gathering the
  // parameters that the recomputed forward then uses (TorchTitan's order: AC, then FSDP around it).
  DataParallelModel dp(*model, par, cfg.parallel, device);
  if (deferred) {
    model->to(device);  // buffers (FSDP gives the parameters their storage on the device)
    dp.initialize([&] { model->init_weights(static_cast<uint64_t>(tc.seed)); });
    if (!cfg.model.pretrained.empty())
      checkpoint::load_model_weights(*model, cfg.model.pretrained, {"lm_head.weight"},
                                     [&](const std::string& k) { return model->parameter_name(k); }, dp.weight_store());
  }
  if (!cfg.features.recompute.empty()) {
    int64_t n = apply_recompute_plan(*model, cfg.features.recompute);
    log::info("plan: recomputing activations of ", n, " blocks");
  }
  int64_t trainable = 0;
  for (auto& p : model->parameters())
    if (p.requires_grad()) trainable += p.numel();
  log::info("model: ", cfg.model.id, " with ", model->num_parameters(), " parameters (", trainable, " trainable), ",
            fmt(model->flops_per_token(seq_len) / 1e6, 2), " MFLOP per text token",
            model->has_vision() ? " (the vision tower's FLOPs are counted per image)" : "");

  auto optimizer = optimizer_registry().get(tc.optimizer.id, "training.optimizer.id")(
      dp.param_groups(tc.optimizer.lr_multipliers), tc.optimizer);
  LRSchedule lr_at = make_lr_schedule(tc.lr_schedule, tc.optimizer.lr, tc.train_iters);

  checkpoint::TrainState state;
  state.config_yaml = config::to_yaml(cfg);
  // On a GPU the next step's micro-batches are read and their copies queued while a step runs.
  DevicePrefetcher batches(*lm.train, device, device.is_cuda() ? tc.gradient_accumulation_steps : 0);

  std::string resume_dir = checkpoint::resolve_resume_dir(tc.resume, tc.save_dir);
  if (!resume_dir.empty()) {
    // Any layout and world size: each rank reads the ranges it holds.
    checkpoint::CheckpointReader reader(resume_dir);
    dp.load_checkpoint(reader, *optimizer);
    auto loaded = reader.train_state();
    state.iteration = loaded.iteration;
    state.consumed_samples = loaded.consumed_samples;
    batches.load_state(reader.loader_state(par.dp_rank(), par.dp_size()));
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(reader.rng_state());
    }
    if (device.is_cuda()) {
      at::Tensor s = reader.rng_state("cuda");
      if (s.defined()) {
        at::Generator g = at::globalContext().defaultGenerator(device);
        std::lock_guard<std::mutex> lock(g.mutex());
        g.set_state(s);
      }
    }
    log::info("resumed from ", resume_dir, " at iteration ", state.iteration, reader.sharded() ? " (sharded checkpoint)" : "");
  }
  dp.broadcast_parameters();  // DDP: identical starting weights, whatever each rank loaded

  std::string metrics_path = tc.metrics_file;
  if (metrics_path.empty() && !tc.save_dir.empty()) metrics_path = (fs::path(tc.save_dir) / "metrics.jsonl").string();
  ProgressReporter progress(par.is_main() ? cfg.tools.progress : "silent", par.is_main() ? metrics_path : "",
                            tc.train_iters, tc.log_interval);

  TrainSummary summary;
  if (lm.val) {
    summary.val_loss_before = evaluate(*model, lm.val, tc.micro_batch_size, tc.eval_iters, bf16, &dp, &par);
    std::string line = cat("validation before training: loss ", fmt(summary.val_loss_before), " (ppl ",
                           fmt(std::exp(summary.val_loss_before), 2), ")");
    nlohmann::json record = {{"iter", state.iteration}, {"val_loss", summary.val_loss_before}};
    if (!lm.val_token_counts.empty()) {
      summary.unigram_baseline = data::unigram_entropy_nats(lm.train_token_counts, lm.val_token_counts);
      line = cat(line, "; unigram baseline ", fmt(summary.unigram_baseline), " (ppl ",
                 fmt(std::exp(summary.unigram_baseline), 2), ")");
      record["unigram_baseline"] = summary.unigram_baseline;
    }
    progress.event(line, record);
  }

  // MM_DEBUG_KILL_AT_ITER=N: the process kills itself (SIGKILL) in the middle of iteration N,
  // after its first forward; the exact-resume tests use it to crash a run between checkpoints.
  // MM_DEBUG_KILL_RANK=r: only rank r does (a rank dying mid-step).
  const char* kill_env = std::getenv("MM_DEBUG_KILL_AT_ITER");
  const char* kill_rank_env = std::getenv("MM_DEBUG_KILL_RANK");
  const int64_t kill_at =
      kill_env && (!kill_rank_env || std::atoi(kill_rank_env) == par.env().rank) ? std::atoll(kill_env) : -1;
  const bool per_sample = tc.loss_normalization == "per_sample";

  double tokens_total = 0, time_total = 0;
  // Every rank writes its part (unsharded layouts: rank 0 the whole model) into one folder that
  // appears only when all have finished.
  auto save = [&] {
    checkpoint::RankCheckpoint part = dp.checkpoint_part(*optimizer);
    part.loader_state = batches.state();
    if (device.is_cuda()) state.device_rng = {"cuda", at::globalContext().defaultGenerator(device).get_state()};
    std::string dir = checkpoint::save_checkpoint(tc.save_dir, state, model->hf_config(), part, par.dp_rank(),
                                                  par.dp_size(), [&] { par.barrier(); });
    progress.event(cat("saved checkpoint ", dir), {{"iter", state.iteration}, {"checkpoint", dir}});
  };

  state.sampler = batches.state();  // a run that takes no step still saves a resumable state
  const int64_t start_iteration = state.iteration;
  bool warned_vision = false;
  while (state.iteration < tc.train_iters) {
    auto t0 = std::chrono::steady_clock::now();
    const double comm0 = parallel::Communicator::wait_seconds();
    std::vector<data::Batch> micro;                      // on the device
    std::vector<models::MultimodalInputs> micro_inputs;  // built once for the forward
    // Local counts of this rank's micro-batches, read from the host copies (no device sync):
    // labeled tokens and scored samples (the loss's normalisers), every real input token, FLOPs.
    double step_tokens = 0, step_samples = 0, input_tokens = 0, step_flops = 0;
    for (int64_t m = 0; m < tc.gradient_accumulation_steps; ++m) {
      DevicePrefetcher::Item item = batches.next();
      const data::Batch& host = item.host;
      step_tokens += static_cast<double>(host.labels.ne(models::kIgnoreIndex).sum().item<int64_t>());
      if (per_sample) step_samples += static_cast<double>(models::scored_samples(host.labels, host.segment_ids));
      const models::MultimodalInputs host_inputs = batch_inputs(host);
      input_tokens += static_cast<double>(models::real_tokens(host_inputs));
      step_flops += model->training_flops(host_inputs);
      micro.push_back(std::move(item.device));
      micro_inputs.push_back(device.is_cpu() ? host_inputs : device_inputs(host, micro.back()));
    }
    // The normaliser is global: every micro-batch's summed loss (over tokens, or over samples'
    // mean token losses) is divided by the count over the whole step on all data-parallel ranks,
    // and DDP sums the gradients, so the update is the same for any DP size and accumulation count.
    const auto global = par.dp_sum({step_tokens, step_samples, input_tokens, step_flops,
                                    static_cast<double>(batches.skipped_samples())});
    const double normaliser = std::max(1.0, per_sample ? global[1] : global[0]);
    at::Tensor loss_sum_t;  // summed on the device, read once after the step's backward passes
    for (size_t m = 0; m < micro.size(); ++m) {
      const data::Batch& b = micro[m];
      if (!warned_vision && !model->has_vision() && (b.pixel_values.defined() || b.pixel_values_videos.defined())) {
        log::warn("model ", cfg.model.id, " has no vision tower: the batches' images and videos are not used, their ",
                  "pad tokens train as ordinary tokens");
        warned_vision = true;
      }
      at::Tensor logits;
      {
        AutocastScope autocast(bf16, device.type());
        dp.begin_forward();
        logits = model->forward_multimodal(micro_inputs[m]);
      }
      if (state.iteration + 1 == kill_at) std::raise(SIGKILL);
      auto ce = per_sample ? models::lm_cross_entropy_per_sample_sum(logits.to(at::kFloat), b.labels, b.segment_ids)
                           : models::lm_cross_entropy_sum(logits.to(at::kFloat), b.labels);
      // DDP reduces once per step, after the last micro-batch; FSDP after every one.
      dp.prepare_backward(ce.sum / normaliser, m + 1 == micro.size()).backward();
      at::Tensor s = ce.sum.detach().to(at::kDouble);
      loss_sum_t = loss_sum_t.defined() ? loss_sum_t + s : s;
    }
    const double loss_sum = loss_sum_t.defined() ? loss_sum_t.item<double>() : 0.0;
    const double loss = par.dp_sum({loss_sum})[0] / normaliser;
    if (!std::isfinite(loss))
      throw Error(cat("training: loss is ", loss, " at iteration ", state.iteration + 1,
                      "; lower training.optimizer.lr or check the data (the last checkpoint is untouched)"));
    const double grad_norm = dp.clip_grad_norm(tc.clip_grad);
    if (state.iteration == start_iteration) {
      // Parameters + gradients + optimizer state held here, against one process alone.
      const TrainMemory mem = dp.memory(*optimizer);
      auto mb = [](int64_t b) { return fmt(static_cast<double>(b) / (1 << 20), 2); };
      progress.event(cat("memory per rank: parameters ", mb(mem.params), " MiB + gradients ", mb(mem.grads),
                         " MiB + optimizer state ", mb(mem.optimizer), " MiB = ", mb(mem.total()), " MiB; one process: ",
                         mb(mem.one_process), " MiB (", fmt(100.0 * mem.total() / std::max<int64_t>(1, mem.one_process), 1),
                         "%)"),
                     {{"iter", state.iteration + 1}, {"memory_bytes", mem.total()}, {"memory_bytes_one_process", mem.one_process},
                      {"optimizer_bytes", mem.optimizer}, {"optimizer_bytes_one_process", mem.optimizer_one_process}});
    }
    const double lr = lr_at(state.iteration);
    dp.before_optimizer_step();
    optimizer->step(lr);
    dp.after_optimizer_step();
    optimizer->zero_grad();
    state.iteration += 1;
    state.consumed_samples += tc.micro_batch_size * tc.gradient_accumulation_steps * par.dp_size();
    state.sampler = batches.state();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    StepMetrics sm;
    sm.iteration = state.iteration;
    sm.loss = loss;
    sm.lr = lr;
    sm.grad_norm = grad_norm;
    sm.step_time_s = dt;
    sm.comm_s = parallel::Communicator::wait_seconds() - comm0;
    sm.tokens = static_cast<int64_t>(global[2]);  // the whole job's
    sm.tokens_per_s = global[2] / dt;
    sm.tflops = global[3] / dt / 1e12;
    sm.mfu = cfg.tools.peak_tflops > 0 ? sm.tflops / cfg.tools.peak_tflops : -1;
    sm.skipped_samples = static_cast<int64_t>(global[4]);
    tokens_total += global[2];
    time_total += dt;
    progress.step(sm);

    if (tc.eval_interval > 0 && state.iteration % tc.eval_interval == 0 && state.iteration < tc.train_iters && lm.val) {
      double v = evaluate(*model, lm.val, tc.micro_batch_size, tc.eval_iters, bf16, &dp, &par);
      progress.event(cat("validation at iteration ", state.iteration, ": loss ", fmt(v), " (ppl ", fmt(std::exp(v), 2), ")"),
                     {{"iter", state.iteration}, {"val_loss", v}});
    }
    if (!tc.save_dir.empty() && tc.save_interval > 0 && state.iteration % tc.save_interval == 0) save();
  }
  summary.iterations = state.iteration;
  summary.mean_tokens_per_s = time_total > 0 ? tokens_total / time_total : 0;
  summary.skipped_samples = static_cast<int64_t>(par.dp_sum({static_cast<double>(batches.skipped_samples())})[0]);
  if (summary.skipped_samples > 0)
    progress.event(cat("data: skipped ", summary.skipped_samples, " bad sample(s) in all (each named in a warning above)"),
                   {{"iter", state.iteration}, {"skipped_samples", summary.skipped_samples}});

  if (lm.val) {
    summary.val_loss_after = evaluate(*model, lm.val, tc.micro_batch_size, tc.eval_iters, bf16, &dp, &par);
    progress.event(cat("validation after training: loss ", fmt(summary.val_loss_after), " (ppl ",
                       fmt(std::exp(summary.val_loss_after), 2), ")"),
                   {{"iter", state.iteration}, {"val_loss", summary.val_loss_after}});
  }
  if (!tc.save_dir.empty() && (tc.save_interval == 0 || state.iteration % tc.save_interval != 0)) save();
  const auto& sc = cfg.tools.sample;
  const bool want_sample = !sc.prompt.empty() && sc.max_new_tokens > 0;
  if (!tc.export_dir.empty()) {
    dp.export_hf(tc.export_dir, model->hf_config());
    progress.event(cat("exported Hugging Face model to ", tc.export_dir), nullptr);
  }
  if (want_sample) dp.gather_full();  // the sample runs on rank 0 alone
  if (want_sample && par.is_main()) {
    auto ids = greedy_generate(*model, lm.encode(sc.prompt), sc.max_new_tokens, lm.eos_id, seq_len);
    summary.sample = lm.decode(ids);
    progress.event(cat("sample (greedy): ", sc.prompt, summary.sample), {{"sample_prompt", sc.prompt}, {"sample", summary.sample}});
  }
  dp.release_full();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const int64_t peak = static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
  progress.event(cat("peak resident memory of rank ", par.env().rank, ": ", fmt(peak / 1048576.0, 1), " MiB (",
                     fmt(start_rss / 1048576.0, 1), " MiB before the run: the engine's libraries)"),
                 {{"iter", state.iteration}, {"peak_rss_bytes", peak}, {"start_rss_bytes", start_rss}});
  return summary;
}

}  // namespace mm::training
