#include "mindspeed_mm/training/trainer.h"

#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <numeric>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/training/evaluation.h"
#include "mindspeed_mm/training/lr_schedule.h"
#include "mindspeed_mm/training/model_builder.h"
#include "mindspeed_mm/core/torch_compat.h"
#include "mindspeed_mm/tools/peak_flops.h"
#include "mindspeed_mm/tools/report.h"
#include "mindspeed_mm/tools/trace.h"
#include "mindspeed_mm/training/parallelize.h"
#include "mindspeed_mm/training/profile.h"
#include "mindspeed_mm/training/progress.h"
#include "mindspeed_mm/training/train_step.h"

namespace fs = std::filesystem;

namespace mm::training {
namespace {

using log::fixed;

std::string mib(int64_t bytes) { return fixed(static_cast<double>(bytes) / (1 << 20), 2); }

// Everything a run holds, set up in the order that matters: process group, data, model (built
// on the device, or as shards under FSDP), plans, objective, optimizer, then the resumed state.
class Run {
 public:
  explicit Run(const config::Config& cfg);

  int64_t iteration() const { return state_.iteration; }
  bool due(int64_t interval) const { return interval > 0 && state_.iteration % interval == 0; }
  bool has_validation() const { return static_cast<bool>(data_.val); }
  // One optimizer step of gradient_accumulation_steps micro-batches, reported.
  void step();
  // The resolved config and the environment beside the metrics file, for `mm report`.
  void write_run_info(const std::string& metrics_path) const;
  // tools.profile: the window opens before step `iteration` and closes after its validation and
  // checkpoint.
  void profile_before(int64_t iteration) {
    if (profile_) profile_->before_step(iteration);
  }
  void profile_after(int64_t iteration) {
    if (profile_) profile_->after_step(iteration);
  }
  // Validation loss, reported as "validation <when>: <objective's words>".
  double validate(const std::string& when, bool with_baseline = false);
  void save();
  void write_adapter(const std::string& dir);
  // After the loop: skipped samples, HF export, the objective's report, peak memory.
  void finish(TrainSummary& summary);

  double tokens_total = 0, time_total = 0;

 private:
  const config::Config& cfg_;
  const config::TrainingConfig& tc_;
  const int64_t start_rss_;
  std::unique_ptr<ProfileWindow> profile_;
  double peak_tflops_ = 0;  // tools.peak_tflops, else a known GPU's bf16 datasheet peak (bf16 runs)
  int64_t peak_seen_ = 0;  // CPU: the largest resident peak before each step's reset
  int64_t step_tensor_peak_ = 0;  // live tensors at their peak in any step (what `mm memory` estimates)
  const at::Device device_;
  data::TrainData data_;                   // both made in prepare(), before par_ joins the ranks
  std::shared_ptr<models::Model> model_;
  TrainParallel par_;
  std::unique_ptr<Objective> objective_;
  std::unique_ptr<InputEncoder> encoder_;  // model.encoders: frozen, applied to every batch first
  std::unique_ptr<DataParallelModel> dp_;
  LoraLayout lora_;
  std::unique_ptr<PipelineRunner> pipeline_;
  std::unique_ptr<Optimizer> optimizer_;
  LRSchedule lr_at_;
  std::unique_ptr<DevicePrefetcher> batches_;
  std::unique_ptr<ProgressReporter> progress_;
  checkpoint::TrainState state_;
  int64_t start_iteration_ = 0, kill_at_ = -1;
  std::vector<std::string> read_fields_;  // what the model and the objective read
  bool warned_unread_ = false;

  // Before any process group: ids, data, and a model built without storage checked against the
  // layout, so a bad config fails on every rank alone with one line.
  void prepare(const TrainParallel& par);
  bool deferred(const TrainParallel& par) const {
    return par.fsdp() || par.shape().tp > 1 || par.shape().pp > 1;
  }
  void setup_model();
  void resume(const std::string& dir);
  void warn_unread_fields(const data::Batch& b);
};

Run::Run(const config::Config& cfg)
    : cfg_(cfg),
      tc_(cfg.training),
      start_rss_((mm::count_cpu_tensor_memory(), mm::resident_bytes())),  // libtorch and its CUDA libraries alone: the same for any model
      device_(resolve_device(tc_.device, parallel::DistEnv::from_environment().local_rank, "training.device")),
      par_(cfg.parallel, parallel::DistEnv::from_environment(), device_, [this](const TrainParallel& p) { prepare(p); }) {
  setup_model();
  objective_ = make_objective(cfg, *model_);
  if (dp_->tp_layout().vocab_parallel_logits) objective_->set_vocab_parallel(par_.tp());
  if (dp_->pipeline_layout()) {
    pipeline_ = std::make_unique<PipelineRunner>(*model_, *dp_->pipeline_layout(), par_.pp());
    pipeline_->set_before_forward([this](const data::Batch& b) { dp_->begin_forward(b); });
    const int m = static_cast<int>(tc_.gradient_accumulation_steps);
    int in_flight = 0;
    for (int s = 0; s < par_.pp_size(); ++s)
      in_flight = std::max(in_flight, max_in_flight(pipeline_schedule(s, par_.pp_size(), m,
                                                                      dp_->pipeline_layout()->virtual_chunks)));
    double bubble = 0;
    print_schedule(par_.pp_size(), m, dp_->pipeline_layout()->virtual_chunks, &bubble);
    log::info("pipeline: ", m, " micro-batches per step; at most ", in_flight,
              " micro-batch activations in flight on a stage; schedule bubble ", fixed(100 * bubble, 1),
              "% (tools.print_schedule shows the timeline)");
    if (cfg.tools.print_schedule)
      log::info("pipeline schedule of one step:\n",
                print_schedule(par_.pp_size(), m, dp_->pipeline_layout()->virtual_chunks));
  }
  encoder_ = make_input_encoder(cfg, device_);
  if (encoder_) {
    encoder_->check(*model_);
    log::info("encoders: ", cfg.model.encoders.id, " from ", cfg.model.encoders.path, ": ", encoder_->describe());
  }
  // The fields the model, the objective and the encoders need must be ones the dataset produces
  // (or the encoders or the objective add).
  std::vector<std::string> needed = model_->required_fields();
  for (const auto& f : objective_->required_fields()) needed.push_back(f);
  std::vector<std::string> have = data_.fields;
  for (const auto& f : objective_->provided_fields()) have.push_back(f);
  if (encoder_) {
    for (const auto& f : encoder_->required_fields()) needed.push_back(f);
    for (const auto& f : encoder_->provided_fields()) have.push_back(f);
  }
  if (std::string missing = data::missing_fields(needed, have); !missing.empty())
    throw ConfigError(cat("config: data.dataset ", cfg.data.dataset, " produces no ", missing, " (model ", cfg.model.id,
                          " with objective ", tc_.objective == "auto" ? model_->default_objective() : tc_.objective,
                          encoder_ ? " and encoders " + cfg.model.encoders.id : std::string(), " needs it)"));
  read_fields_ = needed;
  for (const auto& f : model_->optional_fields()) read_fields_.push_back(f);
  for (const auto& f : objective_->optional_fields()) read_fields_.push_back(f);
  if (dp_->context_parallel()) {  // the attention's, not the model's
    read_fields_.emplace_back(kCpSegmentIds);
    read_fields_.emplace_back(data::kPixelRowsCut);
  }

  optimizer_ = optimizer_registry().get(tc_.optimizer.id, "training.optimizer.id")(
      dp_->param_groups(tc_.optimizer.lr_multipliers), tc_.optimizer);
  lr_at_ = make_lr_schedule(tc_.lr_schedule, tc_.optimizer.lr, tc_.train_iters);

  state_.config_yaml = config::to_yaml(cfg);
  // On a GPU the next step's micro-batches are read and their copies queued while a step runs.
  // Context parallelism: each rank's shard of every batch (its FLOPs are the whole batch's share).
  std::function<void(MicroBatch&)> shard;
  if (const auto& cp = dp_->context_parallel())
    shard = [this, cp](MicroBatch& mb) {
      mb.model_flops = model_->training_flops(mb.host) / cp->layout().size();
      mb.input_tokens = model_->input_tokens(mb.host) / cp->layout().size();
      mb.host = dp_->shard_batch(mb.host);
    };
  batches_ = std::make_unique<DevicePrefetcher>(*data_.train, device_,
                                                device_.is_cuda() ? tc_.gradient_accumulation_steps : 0, shard);
  if (std::string dir = checkpoint::resolve_resume_dir(tc_.resume, tc_.save_dir); !dir.empty()) {
    resume(dir);
  } else if (const std::string old = checkpoint::first_checkpoint_in(tc_.save_dir); !old.empty()) {
    throw ConfigError(cat("config: training.save_dir ", tc_.save_dir, ": already holds checkpoint ", old,
                          tc_.resume == "auto" ? " but no 'latest' file" : "",
                          "; training.resume=auto continues it, or choose another save_dir (nothing was overwritten)"));
  }
  dp_->broadcast_parameters();  // DDP: identical starting weights, whatever each rank loaded
  state_.sampler = batches_->state();  // a run that takes no step still saves a resumable state
  start_iteration_ = state_.iteration;

  std::string metrics_path = tc_.metrics_file;
  if (metrics_path.empty() && !tc_.save_dir.empty()) metrics_path = (fs::path(tc_.save_dir) / "metrics.jsonl").string();
  progress_ = std::make_unique<ProgressReporter>(par_.is_main() ? cfg.tools.progress : "silent",
                                                 par_.is_main() ? metrics_path : "", tc_.train_iters, tc_.log_interval);
  if (par_.is_main() && !metrics_path.empty()) write_run_info(metrics_path);
  if (par_.is_main() && !cfg.tools.tensorboard_dir.empty())
    progress_->enable_tensorboard(cfg.tools.tensorboard_dir, state_.config_yaml, state_.iteration,
                                  [this](int64_t it) { return lr_at_(it); });

  // MM_DEBUG_KILL_AT_ITER=N: the process kills itself (SIGKILL) in the middle of iteration N,
  // after its first forward; the exact-resume tests use it to crash a run between checkpoints.
  // MM_DEBUG_KILL_RANK=r: only rank r does (a rank dying mid-step).
  const char* kill_env = std::getenv("MM_DEBUG_KILL_AT_ITER");
  const char* kill_rank_env = std::getenv("MM_DEBUG_KILL_RANK");
  if (kill_env && (!kill_rank_env || std::atoi(kill_rank_env) == par_.env().rank)) kill_at_ = std::atoll(kill_env);
}

// The model is built without parameter storage, then materialised on the device; under FSDP
// each rank materialises only its shards (parallelize), from the same initialisation or
// checkpoint, so no rank ever holds the whole model.
void Run::prepare(const TrainParallel& par) {
  const config::Config& cfg = cfg_;
  if (tc_.threads > 0) at::set_num_threads(static_cast<int>(tc_.threads));
  set_current_device(device_);
  // Ids first, so a typo fails before the data is read.
  models::model_registry().get(cfg.model.id, "model.id");
  optimizer_registry().get(tc_.optimizer.id, "training.optimizer.id");
  lr_schedule_registry().get(tc_.lr_schedule.id, "training.lr_schedule.id");
  if (tc_.objective != "auto") objective_registry().get(tc_.objective, "training.objective");
  if (!cfg.model.encoders.id.empty()) input_encoder_registry().get(cfg.model.encoders.id, "model.encoders.id");
  if (!par.is_main()) log::set_level(log::Level::kWarn);  // the other ranks stay quiet
  log::info("device: ", describe_device(device_),
            par.env().distributed() ? cat(" (LOCAL_RANK ", par.env().local_rank, ")") : "");

  // Data: each data-parallel rank reads its own shard of every global batch.
  data::DataContext data_ctx;
  data_ctx.micro_batch_size = tc_.micro_batch_size;
  data_ctx.rank = par.dp_rank();
  data_ctx.world = par.dp_size();
  config::DataConfig data_cfg = cfg.data;
  if (cfg.parallel.sequence_parallel) {
    // Sequence parallelism splits every batch's sequence over the tensor-parallel ranks: padded
    // batches are padded to a multiple of them, fixed-length rows must be one.
    const int64_t tp = par.tp_size();
    data_cfg.pad_to_multiple_of = std::lcm(data_cfg.pad_to_multiple_of, tp);
    if (cfg.data.dataset == "text" && cfg.data.seq_len % tp != 0)
      throw ConfigError(cat("config: parallel.sequence_parallel: data.seq_len ", cfg.data.seq_len,
                            " does not divide by parallel.tensor_parallel_size ", tp));
  }
  data_ = data::dataset_registry().get(cfg.data.dataset, "data.dataset")(data_cfg, data_ctx);
  // A model split by the layout is built without storage anyway: build it now and check the fit.
  if (deferred(par)) {
    at::manual_seed(static_cast<uint64_t>(tc_.seed));
    model_ = build_model(cfg_.model, data_, static_cast<uint64_t>(tc_.seed), &cfg_.source_file, /*deferred=*/true, device_);
    check_parallel_layout(*model_, cfg_, par.shape());
  }
}

void Run::setup_model() {
  const auto seed = static_cast<uint64_t>(tc_.seed);
  at::manual_seed(seed);
  if (!model_) model_ = build_model(cfg_.model, data_, seed, &cfg_.source_file, /*deferred=*/false, device_);
  dp_ = parallelize(*model_, cfg_, par_, device_, deferred(par_), &lora_);
  peak_tflops_ = cfg_.tools.peak_tflops > 0 ? cfg_.tools.peak_tflops
                 : tc_.precision == "bf16" && device_.is_cuda() ? tools::datasheet_bf16_tflops(describe_device(device_))
                                                                : 0;
  profile_ = std::make_unique<ProfileWindow>(cfg_.tools.profile, par_.env().rank,
                                             tc_.save_dir.empty() ? "profile" : (fs::path(tc_.save_dir) / "profile").string(),
                                             model_->parts(), peak_tflops_, device_.is_cuda());
  if (profile_->active()) {
    tools::Trace::set_memory_source([dev = device_] { return allocated_bytes(dev); });
    log::info("plan: profiling steps ", cfg_.tools.profile.start_step, "-",
              cfg_.tools.profile.start_step + cfg_.tools.profile.steps - 1, " (", apply_profile_plan(*model_),
              " blocks as ranges) into ", profile_->trace_path());
  } else {
    profile_.reset();
  }
  int64_t trainable = 0;
  for (auto& p : model_->parameters())
    if (p.requires_grad()) trainable += p.numel();
  std::string parts;  // "; vision tower 1200, projector 300, language model 9000"
  if (model_->parts().size() > 1)
    for (const auto& [name, n] : models::parameters_by_part(*model_)) parts += cat(parts.empty() ? "; " : ", ", name, " ", n);
  log::info("model: ", cfg_.model.id, " with ", model_->num_parameters(), " parameters (", trainable, " trainable",
            parts, "), ", model_->cost_summary(cfg_.data.seq_len));
}

// Any layout and world size: each rank reads the ranges it holds.
void Run::resume(const std::string& dir) {
  checkpoint::CheckpointReader reader(dir);
  dp_->load_checkpoint(reader, *optimizer_);
  auto loaded = reader.train_state();
  state_.iteration = loaded.iteration;
  state_.consumed_samples = loaded.consumed_samples;
  batches_->load_state(reader.loader_state(par_.dp_rank(), par_.dp_size()));
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(reader.rng_state());
  }
  if (device_.is_cuda()) {
    at::Tensor s = reader.rng_state("cuda");
    if (s.defined()) {
      at::Generator g = at::globalContext().defaultGenerator(device_);
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(s);
    }
  }
  log::info("resumed from ", dir, " at iteration ", state_.iteration, reader.sharded() ? " (sharded checkpoint)" : "");
}

void Run::warn_unread_fields(const data::Batch& b) {
  std::string unread;
  for (const auto& f : b.fields())
    if (std::find(read_fields_.begin(), read_fields_.end(), f.name) == read_fields_.end())
      unread += (unread.empty() ? "" : ", ") + f.name;
  if (unread.empty()) return;
  log::warn("model ", cfg_.model.id, " reads no ", unread, " of the batches: the data in them is not used");
  warned_unread_ = true;
}

void Run::step() {
  // Each step's own peak. On the CPU that resets the process's high-water mark, so the run's
  // (loading, the previous steps) is kept in peak_seen_ for the final report.
  if (!device_.is_cuda()) peak_seen_ = std::max(peak_seen_, memory_stats(device_).peak_reserved);
  reset_peak_memory(device_);
  const auto t0 = std::chrono::steady_clock::now();
  const double comm0 = parallel::Communicator::wait_seconds();
  tools::TraceScope step_scope("step", "phase", {{"iteration", state_.iteration + 1}});
  std::vector<MicroBatch> micro;
  {
    tools::TraceScope phase("data", "phase");
    for (int64_t m = 0; m < tc_.gradient_accumulation_steps; ++m) {
      micro.push_back(batches_->next());
      // Frozen encoders' FLOPs by part, read before they consume their inputs.
      std::vector<std::pair<std::string, double>> encoder_flops;
      if (encoder_) {
        encoder_flops = encoder_->flops_by_part(micro.back().host);
        for (const auto& [part, f] : encoder_flops) micro.back().extra_flops += f;
        encoder_->encode(micro.back().device, micro.back().host);
      }
      if (!warned_unread_) warn_unread_fields(micro.back().host);
      if (profile_ && profile_->recording()) {
        profile_->add_flops(model_->training_flops_by_part(micro.back().host));
        profile_->add_flops(encoder_flops);
      }
    }
  }
  StepEnv env{*model_, *objective_, *dp_, *optimizer_, par_, tc_.precision == "bf16", tc_.clip_grad};
  env.pipeline = pipeline_.get();
  if (state_.iteration + 1 == kill_at_) env.after_forward = [](size_t) { std::raise(SIGKILL); };
  if (state_.iteration == start_iteration_) {
    // Parameters + gradients + optimizer state held here, against one process alone.
    env.before_update = [&] {
      const TrainMemory mem = dp_->memory(*optimizer_);
      // Every rank's, since pipeline stages and uneven shards differ (a collective: all ranks).
      const auto all = par_.world_gather({static_cast<double>(mem.params), static_cast<double>(mem.grads),
                                          static_cast<double>(mem.optimizer)});
      std::vector<int64_t> totals;
      for (const auto& v : all) totals.push_back(static_cast<int64_t>(v[0] + v[1] + v[2]));
      std::string spread;
      if (totals.size() > 1) {
        const auto [lo, hi] = std::minmax_element(totals.begin(), totals.end());
        spread = cat("; ranks from ", mib(*lo), " MiB (rank ", lo - totals.begin(), ") to ", mib(*hi), " MiB (rank ",
                     hi - totals.begin(), ")");
      }
      if (par_.pp_size() > 1) {
        std::vector<int64_t> stage(static_cast<size_t>(par_.pp_size()), 0);
        for (size_t r = 0; r < totals.size(); ++r) {
          auto& m = stage[static_cast<size_t>(par_.state()->mesh().coords(static_cast<int>(r))[4])];
          m = std::max(m, totals[r]);
        }
        spread += "; largest rank by stage:";
        for (size_t i = 0; i < stage.size(); ++i) spread += cat(i ? ", " : " ", i, ": ", mib(stage[i]), " MiB");
      }
      progress_->event(cat("memory per rank: parameters ", mib(mem.params), " MiB + gradients ", mib(mem.grads),
                           " MiB + optimizer state ", mib(mem.optimizer), " MiB = ", mib(mem.total()),
                           " MiB on rank 0; one process: ", mib(mem.one_process), " MiB (",
                           fixed(100.0 * mem.total() / std::max<int64_t>(1, mem.one_process), 1), "%)", spread),
                       {{"iter", state_.iteration + 1},
                        {"memory_bytes", mem.total()},
                        {"memory_bytes_per_rank", totals},
                        {"memory_bytes_one_process", mem.one_process},
                        {"optimizer_bytes", mem.optimizer},
                        {"optimizer_bytes_one_process", mem.optimizer_one_process}});
    };
  }
  const double lr = lr_at_(state_.iteration);
  const StepResult r =
      train_step(env, micro, lr, state_.iteration,
                 {par_.cp_rank() == 0 ? static_cast<double>(batches_->skipped_samples()) : 0.0});  // cp peers: the same samples
  state_.iteration += 1;
  state_.consumed_samples += tc_.micro_batch_size * tc_.gradient_accumulation_steps * par_.dp_size();
  state_.sampler = batches_->state();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  StepMetrics sm;
  sm.iteration = state_.iteration;
  sm.loss = r.loss;
  sm.lr = lr;
  sm.grad_norm = r.grad_norm;
  sm.step_time_s = dt;
  sm.comm_s = parallel::Communicator::wait_seconds() - comm0;
  sm.tokens = static_cast<int64_t>(r.input_tokens);  // the whole job's
  sm.tokens_per_s = r.input_tokens / dt;
  sm.tflops = r.flops / dt / 1e12;
  sm.mfu = peak_tflops_ > 0 ? sm.tflops / peak_tflops_ : -1;
  sm.skipped_samples = static_cast<int64_t>(r.sums[0]);
  const MemoryStats mem = memory_stats(device_);
  sm.mem_bytes = mem.allocated;
  sm.mem_peak_bytes = mem.peak_allocated;
  step_tensor_peak_ = std::max(step_tensor_peak_, mem.peak_allocated);
  sm.mem_reserved_bytes = mem.reserved;
  sm.mem_peak_reserved_bytes = mem.peak_reserved;
  sm.mem_reserved_label = device_.is_cuda() ? "reserved" : "rss";
  tokens_total += r.input_tokens;
  time_total += dt;
  progress_->step(sm);
}

void Run::write_run_info(const std::string& metrics_path) const {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char started[32];
  std::strftime(started, sizeof(started), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const nlohmann::json info = {
      {"config_yaml", state_.config_yaml},
      {"environment",
       {{"libtorch", compat::torch_version()}, {"device", describe_device(device_)}, {"world_size", par_.env().world_size},
        {"host", host}, {"started", started}, {"intra_op_threads", at::get_num_threads()},
        {"resumed_from_iteration", state_.iteration}}}};
  st::write_file_atomic(tools::run_info_path(metrics_path), info.dump(2) + "\n");
}

double Run::validate(const std::string& when, bool with_baseline) {
  tools::TraceScope phase("validation", "phase");
  std::vector<double> parts;
  std::vector<std::pair<std::string, data::Image>> images;
  const double v = evaluate(*model_, *objective_, data_.val, tc_.micro_batch_size, tc_.eval_iters,
                            tc_.precision == "bf16", dp_.get(), &par_, pipeline_.get(), &parts, encoder_.get(),
                            progress_->tensorboard() ? &images : nullptr);
  for (const auto& [tag, image] : images) progress_->tensorboard()->add_image(tag, image, state_.iteration);
  std::string line = cat("validation ", when, ": ", objective_->describe(v));
  nlohmann::json record = {{"iter", state_.iteration}, {"val_loss", v}};
  record.update(objective_->eval_record(v));
  if (!parts.empty()) {
    Report p = objective_->eval_parts(parts);
    if (!p.text.empty()) line += "; " + p.text;
    record.update(p.record);
  }
  if (with_baseline) {
    Report b = objective_->baseline(data_);
    if (!b.text.empty()) line += "; " + b.text;
    record.update(b.record);
  }
  progress_->event(line, record);
  return v;
}

// Every rank writes its part (unsharded layouts: rank 0 the whole model) into one folder that
// appears only when all have finished.
void Run::save() {
  tools::TraceScope phase("checkpoint", "phase");
  checkpoint::RankCheckpoint part = dp_->checkpoint_part(*optimizer_);
  part.loader_state = batches_->state();
  const parallel::MeshShape& m = par_.shape();
  part.placement = {{"pp", par_.pp_rank()}, {"dp", par_.dp_rank()}, {"cp", par_.cp_rank()}, {"tp", par_.tp_rank()}};
  part.mesh = {{"pp", m.pp}, {"dp_replicate", m.dp_replicate}, {"dp_shard", m.dp_shard}, {"cp", m.cp}, {"tp", m.tp}};
  if (device_.is_cuda()) state_.device_rng = {"cuda", at::globalContext().defaultGenerator(device_).get_state()};
  std::string dir = checkpoint::save_checkpoint(tc_.save_dir, state_, model_->hf_config(), part, par_.env().rank,
                                                par_.env().world_size, [&] { par_.barrier(); });
  if (lora_.enabled()) write_adapter((std::filesystem::path(dir) / "adapter").string());
  progress_->event(cat("saved checkpoint ", dir), {{"iter", state_.iteration}, {"checkpoint", dir}});
}

// LoRA: the adapters (and modules_to_save) in PEFT's format, which peft and `--adapter` load.
void Run::write_adapter(const std::string& dir) {
  const auto tensors = dp_->whole_parameters(lora_.trainable);
  if (par_.is_main())
    save_peft_adapter(dir, peft_adapter_config(*model_, lora_, cfg_.model.pretrained), *model_, tensors);
}

void Run::finish(TrainSummary& summary) {
  summary.iterations = state_.iteration;
  summary.mean_tokens_per_s = time_total > 0 ? tokens_total / time_total : 0;
  summary.skipped_samples = static_cast<int64_t>(par_.dp_sum({static_cast<double>(batches_->skipped_samples())})[0]);
  if (summary.skipped_samples > 0)
    progress_->event(cat("data: skipped ", summary.skipped_samples, " bad sample(s) in all (each named in a warning above)"),
                     {{"iter", state_.iteration}, {"skipped_samples", summary.skipped_samples}});
  if (has_validation()) summary.val_loss_after = validate("after training");
  if (!tc_.save_dir.empty() && !due(tc_.save_interval)) save();
  if (!tc_.export_dir.empty() && lora_.enabled()) {
    write_adapter(tc_.export_dir);
    progress_->event(cat("exported the LoRA adapter (PEFT format) to ", tc_.export_dir), nullptr);
  } else if (!tc_.export_dir.empty()) {
    dp_->export_hf(tc_.export_dir, model_->hf_config());
    progress_->event(cat("exported Hugging Face model to ", tc_.export_dir), nullptr);
  }
  // The objective's closing report runs on rank 0 alone, with the full weights.
  if (objective_->reports_after_training() && pipeline_) {
    log::info("sample: skipped under pipeline parallelism (mm generate on the exported model gives it)");
  } else if (objective_->reports_after_training()) {
    dp_->gather_full();
    if (par_.is_main()) {
      Report r = objective_->after_training(*model_, data_);
      if (r.record.is_object() && !r.record.empty()) r.record["iter"] = state_.iteration;
      if (!r.text.empty()) progress_->event(r.text, r.record);
    }
    dp_->release_full();
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  // Linux reports KiB. On the CPU the steps reset the high-water mark: the run's is the largest seen.
  const int64_t peak = std::max({static_cast<int64_t>(ru.ru_maxrss) * 1024, peak_seen_,
                                 device_.is_cuda() ? int64_t(0) : memory_stats(device_).peak_reserved});
  progress_->event(cat("peak resident memory of rank ", par_.env().rank, ": ", fixed(peak / 1048576.0, 1), " MiB (",
                       fixed(start_rss_ / 1048576.0, 1), " MiB before the run: the engine's libraries)"),
                   {{"iter", state_.iteration}, {"peak_rss_bytes", peak}, {"start_rss_bytes", start_rss_}});
  // Every rank's peak of live tensors in the steps (a collective), the figure `mm memory` estimates.
  const auto peaks = par_.world_gather({static_cast<double>(step_tensor_peak_)});
  std::vector<int64_t> per_rank;
  std::string listed;
  for (size_t r = 0; r < peaks.size(); ++r) {
    per_rank.push_back(static_cast<int64_t>(peaks[r][0]));
    listed += cat(r ? ", " : "", fixed(peaks[r][0] / 1048576.0, 2));
  }
  if (!per_rank.empty() && per_rank.front() > 0)
    progress_->event(cat("peak tensor memory in the steps (MiB) by rank: ", listed),
                     {{"iter", state_.iteration}, {"peak_tensor_bytes_per_rank", per_rank}});
  if (profile_) profile_->finish();
  // No rank leaves while others still communicate: rank 0 hosts the store every collective
  // reports to, and a pipeline stage's last exchanges can outlast rank 0's export.
  par_.barrier();
}

}  // namespace

TrainSummary train(const config::Config& given) {
  config::Config cfg = given;
  if (given.training.global_batch_size > 0) {
    const parallel::MeshShape mesh = resolve_mesh_shape(given.parallel, parallel::DistEnv::from_environment().world_size);
    cfg.training = resolve_global_batch(given.training, mesh.dp_replicate * mesh.dp_shard);
  }
  Run run(cfg);
  TrainSummary summary;
  if (run.has_validation()) summary.val_loss_before = run.validate("before training", /*with_baseline=*/true);
  while (run.iteration() < cfg.training.train_iters) {
    run.profile_before(run.iteration() + 1);
    run.step();
    const bool last = run.iteration() == cfg.training.train_iters;
    if (run.due(cfg.training.eval_interval) && !last && run.has_validation()) run.validate(cat("at iteration ", run.iteration()));
    if (!cfg.training.save_dir.empty() && run.due(cfg.training.save_interval)) run.save();
    run.profile_after(run.iteration());
  }
  run.finish(summary);
  return summary;
}

}  // namespace mm::training
