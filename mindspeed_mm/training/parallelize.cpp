#include "mindspeed_mm/training/parallelize.h"

#include <ATen/core/grad_mode.h>

#include <optional>
#include <set>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/parallel/tensor_parallel.h"
#include "mindspeed_mm/training/context_parallel.h"
#include "mindspeed_mm/training/model_builder.h"
#include "mindspeed_mm/training/plans.h"
#include "mindspeed_mm/training/pipeline.h"
#include "mindspeed_mm/training/recompute.h"
#include "mindspeed_mm/training/tensor_parallel_plan.h"

namespace mm::training {

namespace {

TpOptions tp_options(const config::Config& cfg, const models::PlanTable& plans) {
  TpOptions o;
  o.sequence_parallel = cfg.parallel.sequence_parallel;
  o.sequence_parallel_blocks = plans.sequence_parallel;
  return o;
}

}  // namespace

void check_parallel_layout(models::Model& model, const config::Config& cfg, const parallel::MeshShape& mesh) {
  const models::PlanTable plans = model.plans();
  if (mesh.tp > 1) {
    if (plans.tensor_parallel.empty())
      throw ConfigError(cat("config: parallel.tensor_parallel_size ", mesh.tp, ": model ", cfg.model.id,
                            " has no tensor-parallel plan"));
    check_tensor_parallel_plan(model, plans.tensor_parallel, mesh.tp, tp_options(cfg, plans));
  }
  std::optional<PipelineLayout> pipe;
  if (mesh.pp > 1) {
    if (shards_parameters(cfg.parallel, mesh))
      throw ConfigError("config: parallel.pipeline_parallel_size > 1 with FSDP (data_parallel_shard_size > 1) is not "
                        "built yet: use DDP or ZeRO-1 (data_parallel_replicate_size, distributed_optimizer)");
    const int vp = resolve_virtual_pipeline_size(model, cfg.parallel);
    pipe = make_pipeline_layout(model, cfg.parallel.pipeline_num_layers, mesh.pp, vp);
    pipeline_schedule(0, mesh.pp, static_cast<int>(cfg.training.gradient_accumulation_steps), vp);  // micro-batch count
  }
  if (mesh.cp > 1) {
    if (plans.context_parallel.empty())
      throw ConfigError(cat("config: parallel.context_parallel_size ", mesh.cp, ": model ", cfg.model.id,
                            " has no context-parallel plan (PlanTable::context_parallel)"));
    resolve_cp_layout(cfg.parallel);
    if (mesh.pp > 1 && !plans.context_parallel_blocks.empty() && !plans.context_parallel_length)
      throw ConfigError(cat("config: parallel.context_parallel_size > 1 with pipeline parallelism is not built yet for ",
                            cfg.model.id, " (it cuts its sequence inside the model without saying how long it is)"));
    if (pipe && !plans.context_parallel_encoders.empty()) {
      // An encoder's stretch is cut and gathered by one process: all of its blocks on one stage.
      for (const auto& stretch : plans.context_parallel_encoders) {
        std::set<int> stages;
        for_each_matching_module(model, stretch.blocks, "context-parallel blocks",
                                 [&](const std::string& path, mm::nn::Module& m) {
                                   const auto params = m.named_parameters();
                                   if (params.empty()) return;
                                   for (int s = 0; s < mesh.pp; ++s)
                                     if (pipe->held_by(path + "." + params.front().first, s)) stages.insert(s);
                                 });
        if (stages.size() > 1)
          throw ConfigError(cat("config: parallel.context_parallel_size > 1 cuts ", stretch.blocks.front(),
                                " among the cp ranks, but the pipeline spreads those blocks over ", stages.size(),
                                " stages; keep them on one (parallel.pipeline_num_layers)"));
      }
    }
    if (cfg.training.loss_normalization == "per_sample" && plans.context_parallel_blocks.empty())
      throw ConfigError("config: training.loss_normalization: per_sample with parallel.context_parallel_size > 1 is not built "
                        "yet (a sample's tokens are spread over the cp ranks); use per_token");
    if (!cfg.model.encoders.id.empty())
      throw ConfigError("config: model.encoders with parallel.context_parallel_size > 1 is not built yet");
  }
  if (cfg.training.loss_chunk_size > 0) {
    if (!dynamic_cast<models::CausalLM*>(&model))
      throw ConfigError(cat("config: training.loss_chunk_size: model ", cfg.model.id, " is not a language model"));
  }
}

std::unique_ptr<DataParallelModel> parallelize(models::Model& model, const config::Config& cfg,
                                               const TrainParallel& mesh, at::Device device, bool deferred,
                                               LoraLayout* lora_out) {
  check_parallel_layout(model, cfg, mesh.shape());
  // 1. freeze
  if (const int64_t n = freeze_parts(model, cfg.model); n > 0) log::info("plan: froze ", n, " parameter tensors of model.parts");
  if (!cfg.features.freeze.empty())
    log::info("plan: froze ", apply_freeze_plan(model, cfg.features.freeze), " parameter tensors");
  // LoRA: adapters on the targets (initialised now unless deferred: step 4 does it then), the
  // rest frozen; a PEFT adapter to continue from is loaded once the adapters have their values.
  LoraLayout lora;
  const auto seed = static_cast<uint64_t>(cfg.training.seed);
  if (cfg.features.lora.enabled()) {
    if (cfg.parallel.sequence_parallel)
      throw ConfigError("config: features.lora with parallel.sequence_parallel is not built yet (LoRA works with "
                        "DDP, FSDP and tensor parallelism)");
    if (cfg.features.lora.base_dtype == "bf16") {
      if (cfg.training.precision != "bf16")
        throw ConfigError("config: features.lora.base_dtype: bf16 needs training.precision: bf16 (the frozen bf16 "
                          "weights meet the fp32 adapters under bf16 autocast)");
      if (mesh.fsdp())
        throw ConfigError("config: features.lora.base_dtype: bf16 with FSDP (data_parallel_shard_size > 1) is not built "
                          "yet: FSDP already holds 1/N of the base; use parallel.fsdp.param_dtype: bf16 to gather it in bf16");
    }
    lora = apply_lora_plan(model, cfg.features.lora);
    if (!deferred) {
      init_lora_weights(model, lora, seed);
      if (!cfg.features.lora.adapter.empty()) load_peft_adapter(model, cfg.features.lora.adapter);
    }
    int64_t adapters = 0;
    for (auto& [name, p] : model.named_parameters())
      if (LoraLayout::is_adapter(name)) adapters += p.numel();
    log::info("plan: LoRA rank ", cfg.features.lora.rank, " alpha ", cfg.features.lora.alpha, " on ", lora.targets.size(),
              " Linear layers (", adapters, " adapter parameters)",
              lora.saved.empty() ? std::string() : cat(", ", lora.saved.size(), " modules trained whole"),
              cfg.features.lora.adapter.empty() ? std::string() : cat(", from the PEFT adapter ", cfg.features.lora.adapter));
  }
  // 2. tensor parallel
  const models::PlanTable plans = model.plans();
  TpLayout tp;
  if (mesh.tp_size() > 1) {
    tp = apply_tensor_parallel_plan(model, plans.tensor_parallel, mesh.tp(), tp_options(cfg, plans));
    log::info("plan: tensor parallel over ", mesh.tp_size(), " ranks: ", tp.modules, " modules split",
              cfg.parallel.sequence_parallel ? ", sequence parallel between the blocks" : "",
              tp.vocab_parallel_logits ? ", logits left split along the vocabulary" : "");
  }
  // 2b. context parallel: the named attention modules reach the other cp ranks' tokens (after
  // tensor parallelism, which leaves each module its share of the heads).
  std::shared_ptr<ContextParallel> cp;
  std::vector<std::shared_ptr<ContextParallel>> cp_encoders;
  if (mesh.cp_size() > 1) {
    const parallel::CpLayout layout = resolve_cp_layout(cfg.parallel);
    cp = std::make_shared<ContextParallel>(layout, mesh.cp(), cfg.parallel.sequence_parallel ? mesh.tp_size() : 1);
    const int64_t n = cp->apply(model, plans.context_parallel, plans.context_parallel_blocks, plans.context_parallel_length);
    cp->set_batch_plan(plans.context_parallel_prepare, plans.context_parallel_whole);
    log::info("plan: context parallel over ", mesh.cp_size(), " ranks (",
              layout.ring == 1 ? "Ulysses" : layout.ulysses == 1 ? "ring, zigzag" : cat("hybrid: Ulysses ", layout.ulysses,
                                                                                          " x ring ", layout.ring),
              "): ", n, " attention modules, sequences padded to a multiple of ",
              layout.multiple() * (cfg.parallel.sequence_parallel ? mesh.tp_size() : 1),
              cp->shards_batches() ? ", each rank's tokens cut from the batch" : ", cut inside the model between its blocks");
    // Encoders (a vision tower) cut their own sequences: by the same layout where their heads
    // split over its Ulysses degree, else by a ring over the cp ranks (their attention is not
    // causal, so any cut balances).
    for (const models::PlanTable::CpStretch& stretch : plans.context_parallel_encoders) {
      const std::string misfit = ContextParallel::ulysses_misfit(model, stretch.attention, layout.ulysses);
      // (The same layout shares the groups: made once.)
      const parallel::CpLayout own = misfit.empty() ? layout : parallel::CpLayout{1, layout.size()};
      auto enc = misfit.empty() ? std::make_shared<ContextParallel>(*cp, 1) : std::make_shared<ContextParallel>(own, mesh.cp());
      const int64_t m = enc->apply_encoder(model, stretch);
      cp_encoders.push_back(enc);
      const std::string algo = !misfit.empty()     ? cat("ring: ", misfit)
                               : own.ring == 1    ? std::string("Ulysses")
                               : own.ulysses == 1 ? std::string("ring")
                                                  : std::string("hybrid");
      log::info("plan: context parallel: ", stretch.blocks.front(), " cut over the ", mesh.cp_size(), " ranks too (", algo,
                "): ", m, " attention modules", stretch.inputs.empty() ? "" : ", each rank handed only its rows of the input");
    }
  }
  // 3. pipeline: this stage keeps only the parameters its chunks use (the others keep their full
  // shape for checkpoints and no storage, and take no gradient).
  std::optional<PipelineLayout> pipeline;
  if (mesh.pp_size() > 1) {
    pipeline = make_pipeline_layout(model, cfg.parallel.pipeline_num_layers, mesh.pp_size(),
                                    resolve_virtual_pipeline_size(model, cfg.parallel));
    at::NoGradGuard no_grad;
    int64_t kept = 0;
    for (auto& [name, p] : model.named_parameters())
      if (p.requires_grad()) pipeline->trainable.insert(name);
    for (auto& [name, p] : model.named_parameters()) {
      if (pipeline->held_by(name, mesh.pp_rank())) {
        ++kept;
        continue;
      }
      at::Tensor t = p;
      mm::nn::set_full_shape(t, mm::nn::full_shape(t));
      t.requires_grad_(false);
      mm::nn::reshape_deferred(t, {0});
    }
    log::info("plan: pipeline over ", mesh.pp_size(), " stages", pipeline->virtual_chunks > 1
              ? cat(" x ", pipeline->virtual_chunks, " virtual chunks (interleaved 1F1B)") : " (1F1B)",
              ": ", pipeline->describe(), "; this stage holds ", kept, " parameter tensors");
  }
  // Without FSDP each parameter gets its storage, at its (tensor-parallel) shape, before DDP
  // and ZeRO-1 take it in; its values come in step 4.
  const bool fsdp = mesh.fsdp();
  if (deferred && !fsdp) mm::nn::materialize(model, device);
  // 3. data parallel
  config::ParallelConfig pc = cfg.parallel;
  if (pc.fsdp.units.empty()) pc.fsdp.units = plans.fsdp_units;
  auto dp = std::make_unique<DataParallelModel>(model, mesh, pc, device, std::move(tp), std::move(pipeline));
  dp->set_context_parallel(cp, std::move(cp_encoders));
  // 4. materialise
  if (deferred) {
    if (fsdp) model.to(device);  // buffers (FSDP gives the parameters their storage on the device)
    dp->initialize([&] {
      {
        HiddenAdapters hidden(model, lora);  // the base's draws as without LoRA (one process's)
        model.init_weights(seed);
      }
      if (lora.enabled()) init_lora_weights(model, lora, seed);
    });
    if (!cfg.model.pretrained.empty())
      checkpoint::load_weights(base_parameters(model), cfg.model.pretrained, model.optional_checkpoint_tensors(),
                               [&](const std::string& k) { return model.parameter_name(k); }, dp->weight_store());
    load_part_weights(model, cfg.model, dp->weight_store());
    if (lora.enabled() && !cfg.features.lora.adapter.empty())
      load_peft_adapter(model, cfg.features.lora.adapter, dp->weight_store());
    dp->weights_changed();
  }
  // The frozen base in bf16 (features.lora.base_dtype): cast once its values are loaded; the
  // adapters and modules_to_save keep their fp32 values for the optimizer.
  if (lora.enabled() && cfg.features.lora.base_dtype == "bf16") {
    at::NoGradGuard no_grad;
    int64_t cast = 0;
    for (auto& [name, p] : model.named_parameters())
      if (!lora.trainable.count(name) && p.is_floating_point() && p.scalar_type() != at::kBFloat16) {
        p.set_data(p.to(at::kBFloat16));
        ++cast;
      }
    log::info("plan: LoRA base held in bf16 (", cast, " frozen parameter tensors)");
  }
  // 5. recompute, and offload (recompute with the kept inputs in host memory)
  if (!cfg.features.recompute.empty())
    log::info("plan: recomputing activations of ", apply_recompute_plan(model, cfg.features.recompute),
              " modules (blocks, or attention / MLP alone)");
  if (!cfg.features.offload.empty()) {
    if (!device.is_cuda())
      throw ConfigError(cat("config: features.offload needs a CUDA device (training.device is ", device.str(),
                            "); on the CPU use features.recompute, which keeps the same one input per block"));
    log::info("plan: offloading the kept inputs of ", apply_offload_plan(model, cfg.features.offload),
              " recomputed blocks to pinned host memory");
  }
  // 6. the head fused with the loss, in chunks (checked above: a language model, no TP or PP)
  if (cfg.training.loss_chunk_size > 0) {
    auto& lm = dynamic_cast<models::CausalLM&>(model);
    lm.set_loss_chunk(cfg.training.loss_chunk_size);
    const bool vocab_parallel = dp->tp_layout().vocab_parallel_logits;
    if (vocab_parallel)  // the head split along the vocabulary: each rank's columns of every chunk
      lm.set_chunked_loss([tp = mesh.tp()](const at::Tensor& h, const at::Tensor& w, const at::Tensor& y, int64_t c) {
        return parallel::vocab_parallel_chunked_cross_entropy(h, w, y, c, tp);
      });
    log::info("plan: head and cross-entropy in chunks of ", cfg.training.loss_chunk_size, " tokens (no whole logits",
              vocab_parallel ? cat(", each rank's 1/", mesh.tp_size(), " of the vocabulary)") : std::string(")"));
  }
  if (lora.enabled()) dp->set_checkpoint_trainable_only(true);  // the base comes from model.pretrained
  if (lora_out) *lora_out = std::move(lora);
  return dp;
}

}  // namespace mm::training
