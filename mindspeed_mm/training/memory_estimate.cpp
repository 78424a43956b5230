#include "mindspeed_mm/training/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>

#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/core/pattern.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/data/media/qwen2vl_image_processor.h"
#include "mindspeed_mm/models/causal_lm.h"
#include "mindspeed_mm/training/context_parallel.h"
#include "mindspeed_mm/training/model_builder.h"
#include "mindspeed_mm/training/objectives/objective.h"
#include "mindspeed_mm/training/parallel_setup.h"
#include "mindspeed_mm/training/parallelize.h"
#include "mindspeed_mm/training/pipeline.h"
#include "mindspeed_mm/training/plans.h"
#include "mindspeed_mm/training/tensor_parallel_plan.h"

namespace mm::training {

namespace {

int64_t batch_bytes(const data::Batch& b) {
  int64_t n = 0;
  for (const auto& f : b.fields())
    if (f.tensor.defined()) n += f.tensor.numel() * static_cast<int64_t>(f.tensor.element_size());
  return n;
}

// Tokens a batch's activations scale with: its rows' positions, and a vision tower's patches.
int64_t batch_size_key(const data::Batch& b) {
  int64_t n = 0;
  for (const auto& f : b.fields())
    if (f.tensor.defined() && f.tensor.is_floating_point()) n += f.tensor.numel();
  if (b.has(data::kInputIds)) n += b[data::kInputIds].numel();
  return n;
}

std::string describe_layout(const parallel::MeshShape& m, bool zero1, bool sp, const config::ParallelConfig& pc) {
  std::vector<std::string> parts;
  const bool fsdp = shards_parameters(pc, m);
  if (m.pp > 1) parts.push_back(cat("pp ", m.pp));
  if (m.dp_replicate > 1) parts.push_back(cat(fsdp ? "replicate " : "ddp ", m.dp_replicate, zero1 ? " (ZeRO-1)" : ""));
  if (fsdp)
    parts.push_back(m.cp > 1 ? cat("fsdp ", m.dp_shard * m.cp, " (dp_shard ", m.dp_shard, " x cp ", m.cp, ")")
                             : cat("fsdp ", m.dp_shard));
  if (m.cp > 1) {
    const parallel::CpLayout l = resolve_cp_layout(pc);
    parts.push_back(cat("cp ", m.cp, l.ring == 1 ? " (Ulysses)" : l.ulysses == 1 ? " (ring)" : cat(" (Ulysses ", l.ulysses, " x ring ", l.ring, ")")));
  }
  if (m.tp > 1) parts.push_back(cat("tp ", m.tp, sp ? " (sequence parallel)" : ""));
  if (parts.empty()) return "one process";
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? " x " : "") + parts[i];
  return s;
}

std::string mib(int64_t b) { return log::fixed(static_cast<double>(b) / 1048576.0, 2) + " MiB"; }

// A family without a count of its own, when its parameters are small (a VAE): one and two
// samples of the batch through the real model and objective, forward and backward, under the
// counting allocator; forward's end and the step's peak are then a + b x samples, extended to
// the batch (the samples are independent).
std::optional<models::ActivationEstimate> probe_activations(const config::Config& cfg, int64_t vocab,
                                                            const data::Batch& batch, int64_t param_bytes) {
  constexpr int64_t kLargest = int64_t(2) << 30;
  if (param_bytes > kLargest) return std::nullopt;
  const int64_t B = batch.num_samples > 0 ? batch.num_samples : 1;
  auto model = build_model(cfg.model, vocab, static_cast<uint64_t>(cfg.training.seed), &cfg.source_file);
  const auto objective = make_objective(cfg, *model);
  auto measure = [&](int64_t n) {
    data::Batch part;
    for (const auto& f : batch.fields())
      part.set(f.name,
               f.tensor.defined() && f.tensor.dim() > 0 && f.tensor.size(0) == B ? f.tensor.narrow(0, 0, n).clone() : f.tensor,
               f.host);
    part.num_samples = n;
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    const int64_t base = cpu_tensor_bytes();
    reset_peak_cpu_tensor_bytes();
    objective->prepare(part, 0);
    at::Tensor loss = objective->loss_sum(model->forward(part), part);
    const int64_t forward = cpu_tensor_bytes() - base;
    loss.backward();
    int64_t grads = 0;
    for (auto& p : model->parameters())
      if (p.grad().defined()) grads += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
    return std::pair<int64_t, int64_t>{forward, std::max<int64_t>(forward, peak_cpu_tensor_bytes() - base - grads)};
  };
  const auto [f1, p1] = measure(1);
  const auto [f2, p2] = B > 1 ? measure(2) : std::pair<int64_t, int64_t>{2 * f1, 2 * p1};
  const int64_t forward = std::max<int64_t>(0, f1 + (f2 - f1) * (B - 1));
  const int64_t peak = std::max<int64_t>(forward, p1 + (p2 - p1) * (B - 1));
  models::ActivationEstimate e;
  e.before = forward;
  e.backward_extra = peak - forward;
  e.notes.emplace_back(cat("measured on 1 and 2 samples (", mib(f1), ", ", mib(f2), " at forward's end), extended to ", B),
                       forward);
  return e;
}

// micro_batch_size rows of seq_len tokens, each with opt.images images through the processor's
// resize: Qwen2-VL's patches and grids, or a fixed-size processor's pixels.
data::Batch synthetic_batch(const config::Config& cfg, int64_t rows, const MemoryOptions& opt) {
  data::Batch b;
  const auto ids = at::zeros({rows, opt.seq_len}, at::kLong);
  b.set(data::kInputIds, ids);
  b.set(data::kLabels, ids.clone());
  b.num_samples = rows;
  const int64_t n = rows * opt.images;
  if (n == 0) return b;
  const auto& p = cfg.data.processor;
  if (p.type == "qwen2vl") {
    const auto [h, w] = data::smart_resize(static_cast<int>(opt.image_height), static_cast<int>(opt.image_width),
                                           static_cast<int>(p.patch_size * p.merge_size), p.min_pixels, p.max_pixels);
    const int64_t gh = h / p.patch_size, gw = w / p.patch_size;
    b.set(data::kPixelValues, at::zeros({n * gh * gw, 3 * p.temporal_patch_size * p.patch_size * p.patch_size}));
    b.set(data::kImageGridThw, at::tensor(std::vector<int64_t>{1, gh, gw}, at::kLong).repeat({n, 1}), true);
  } else {
    b.set(data::kPixelValues, at::zeros({n, 3, p.image_size, p.image_size}));
  }
  return b;
}

// A synthetic batch's images into its rows as the model's prompts hold them (its placeholder
// tokens one after another from each row's start), so that its rows say where their features go.
void place_synthetic_images(data::Batch& b, const models::Model& model, const config::Config& cfg) {
  const auto* lm = dynamic_cast<const models::CausalLM*>(&model);
  const at::Tensor& grid = b[data::kImageGridThw];
  if (!lm || !grid.defined()) return;
  at::Tensor ids = b.require(data::kInputIds).clone();
  const int64_t rows = ids.size(0), S = ids.size(1), per_row = grid.size(0) / rows;
  const int64_t unit = cfg.data.processor.merge_size * cfg.data.processor.merge_size;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0;
    for (int64_t i = 0; i < per_row; ++i) {
      const std::vector<int64_t> t = lm->image_placeholder(grid[r * per_row + i].prod().item<int64_t>() / unit);
      if (at + static_cast<int64_t>(t.size()) > S)
        throw RowTooShort(cat("mm memory: a row of --seq-len ", S, " tokens cannot hold its ", per_row, " image(s) of ",
                              t.size(), " tokens each"));
      ids[r].narrow(0, at, static_cast<int64_t>(t.size())).copy_(at::tensor(t, at::kLong));
      at += static_cast<int64_t>(t.size());
    }
  }
  b.set(data::kInputIds, ids);
}

std::string describe_batch(const data::Batch& b) {
  std::string s;
  if (b.has(data::kInputIds)) {
    const auto& ids = b[data::kInputIds];
    s = cat(ids.size(0), " x ", ids.size(-1), " tokens");
  }
  for (const auto& f : b.fields()) {
    if (!f.tensor.defined() || !f.tensor.is_floating_point()) continue;
    std::string shape;
    for (int64_t d = 0; d < f.tensor.dim(); ++d) shape += (d ? " x " : "") + std::to_string(f.tensor.size(d));
    s += (s.empty() ? "" : ", ") + f.name + " " + shape;
  }
  return s;
}

}  // namespace

MemoryEstimate estimate_memory(const config::Config& cfg, const MemoryOptions& opt) {
  const auto& pc = cfg.parallel;
  int world = opt.world;
  if (world <= 0)
    world = static_cast<int>(pc.pipeline_parallel_size * pc.data_parallel_replicate_size *
                             std::max<int64_t>(1, pc.data_parallel_shard_size) * pc.context_parallel_size *
                             pc.tensor_parallel_size);
  const parallel::MeshShape mesh = resolve_mesh_shape(pc, world);
  if (cfg.features.lora.enabled()) throw ConfigError("mm memory: features.lora is not estimated yet (LoRA runs print their memory at the first step)");
  if (!cfg.model.encoders.id.empty())
    throw ConfigError("mm memory: model.encoders (online encoders) are not estimated yet");
  const int dp = mesh.dp_replicate * mesh.dp_shard;
  const config::TrainingConfig tc = resolve_global_batch(cfg.training, dp);
  // Context-parallel ranks share the weights' reduction (DDP over dp x cp, FSDP over dp_shard x cp).
  const int grad_ranks = dp * mesh.cp, shard_ranks = mesh.dp_shard * mesh.cp;
  const int64_t micro = tc.gradient_accumulation_steps;

  MemoryEstimate out;
  out.model = cfg.model.id;
  out.world = world;
  out.layout = describe_layout(mesh, pc.distributed_optimizer, pc.sequence_parallel, pc);

  data::Batch batch;
  int64_t data_bytes = 0, vocab = 0;
  if (opt.seq_len > 0) {
    batch = synthetic_batch(cfg, tc.micro_batch_size, opt);
    data_bytes = micro * batch_bytes(batch);
    out.notes.push_back("data: the micro-batches alone (no dataset opened)");
  } else {
    // The data as rank 0 of the data-parallel group reads it: what it holds once open (measured)
    // and the largest of the first batches.
    count_cpu_tensor_memory();
    const int64_t before_data = cpu_tensor_bytes();
    data::DataContext ctx;
    ctx.micro_batch_size = tc.micro_batch_size;
    ctx.rank = 0;
    ctx.world = dp;
    config::DataConfig dc = cfg.data;
    if (pc.sequence_parallel) dc.pad_to_multiple_of = std::lcm(dc.pad_to_multiple_of, static_cast<int64_t>(mesh.tp));
    data::TrainData data = data::dataset_registry().get(cfg.data.dataset, "data.dataset")(dc, ctx);
    const int64_t opened = cpu_tensor_bytes() - before_data;
    vocab = data.vocab_size;
    std::vector<data::Batch> seen;
    for (int i = 0; i < std::max(1, opt.batches); ++i) seen.push_back(data.train->next());
    batch = *std::max_element(seen.begin(), seen.end(), [](const data::Batch& a, const data::Batch& b) {
      return batch_size_key(a) < batch_size_key(b);
    });
    // The dataset's own tensors as it opened (a text corpus's tokens), a step's micro-batches and,
    // through the threaded loader, those it prefetches.
    const bool threaded = cfg.data.dataset != "text" && cfg.data.num_workers > 0;
    data_bytes = opened + (micro + (threaded ? cfg.data.prefetch : 0)) * batch_bytes(batch);
  }
  out.batch = describe_batch(batch);
  // On a GPU the device holds a step's micro-batches (the dataset and the prefetched batches
  // stay on the host) and cuBLAS's workspace, which the caching allocator counts.
  const bool cuda = resolve_device(tc.device, 0, "training.device").is_cuda();
  if (cuda) {
    data_bytes = micro * batch_bytes(batch) + (int64_t(33) << 20);
    out.notes.push_back("cuda: data is the micro-batches on the device plus 33 MiB of cuBLAS workspace (the Hopper "
                        "default; not yet compared with a GPU run)");
  }

  // The model without storage, frozen as the run freezes it.
  std::shared_ptr<models::Model> model = opt.model_cache ? *opt.model_cache : nullptr;
  if (!model) model = build_model(cfg.model, vocab, static_cast<uint64_t>(tc.seed), &cfg.source_file, /*deferred=*/true);
  if (opt.model_cache) *opt.model_cache = model;
  check_parallel_layout(*model, cfg, mesh);
  if (opt.seq_len > 0) place_synthetic_images(batch, *model, cfg);
  freeze_parts(*model, cfg.model);
  if (!cfg.features.freeze.empty()) apply_freeze_plan(*model, cfg.features.freeze);
  const models::PlanTable plans = model->plans();
  TpLayout tp;
  if (mesh.tp > 1) tp = tensor_parallel_splits(*model, plans.tensor_parallel, mesh.tp);
  std::optional<PipelineLayout> pipe;
  if (mesh.pp > 1)
    pipe = make_pipeline_layout(*model, pc.pipeline_num_layers, mesh.pp, resolve_virtual_pipeline_size(*model, pc));
  const auto recompute = compile_patterns(cfg.features.recompute);
  const bool fsdp = shards_parameters(pc, mesh), ddp = mesh.dp_replicate * mesh.cp > 1 && !fsdp;
  const bool zero1 = pc.distributed_optimizer && ddp;
  // Context parallel: a rank's share of each batch (a text model's token fields are cut before it).
  parallel::CpLayout cp_layout;
  const bool cp_inside = mesh.cp > 1 && !plans.context_parallel_blocks.empty();
  if (cp_inside) {
    // A model that cuts inside holds the whole batch (its pixel rows cut, a small share of it).
    cp_layout = resolve_cp_layout(pc);
    out.batch += cat(" (its sequence cut over ", mesh.cp, " context-parallel ranks inside the model)");
  } else if (mesh.cp > 1) {
    cp_layout = resolve_cp_layout(pc);
    const int64_t whole = batch_bytes(batch);
    if (plans.context_parallel_prepare) batch = plans.context_parallel_prepare(batch);
    batch = shard_for_rank(batch, cp_layout, 0, pc.sequence_parallel ? mesh.tp : 1, plans.context_parallel_whole);
    data_bytes += micro * (batch_bytes(batch) - whole);
    out.batch = describe_batch(batch) + cat(" per rank (cut over ", mesh.cp, " context-parallel ranks)");
  }
  const auto fsdp_units = compile_patterns(pc.fsdp.units.empty() ? plans.fsdp_units : pc.fsdp.units);
  if (tc.precision == "bf16")
    out.notes.push_back("training.precision bf16: activations are counted as fp32 ones halved (the estimate is "
                        "measured in fp32 only)");

  for (int stage = 0; stage < mesh.pp; ++stage) {
    RankMemory r;
    r.role = mesh.pp > 1 ? cat("stage ", stage) : "every rank";
    for (int rank = 0; rank < world; ++rank)
      if (rank / (world / mesh.pp) == stage) r.ranks.push_back(rank);
    // Parameters, gradients (fp32 for every trainable one) and AdamW's two moments; FSDP's units
    // whole, as gathered (parameters) and before the reduce-scatter (gradients).
    std::map<std::string, std::pair<int64_t, int64_t>> units;  // unit -> (gathered, full gradients)
    for (const auto& [name, p] : model->named_parameters()) {
      if (pipe && !pipe->held_by(name, stage)) continue;
      int64_t n = p.numel();
      if (tp.split(name)) n /= mesh.tp;
      if (fsdp) n = (n + shard_ranks - 1) / shard_ranks;
      r.params += n * static_cast<int64_t>(p.element_size());
      if (!p.requires_grad()) continue;
      r.grads += n * 4;
      r.optimizer += (zero1 ? (n + grad_ranks - 1) / grad_ranks : n) * 8;
      if (zero1) r.params += (n + grad_ranks - 1) / grad_ranks * 4;  // the shard the optimizer updates, gathered after
    }
    if (fsdp)
      for (const auto& [name, p] : model->named_parameters()) {
        std::string unit;
        for (size_t dot = name.find('.'); dot != std::string::npos && unit.empty(); dot = name.find('.', dot + 1))
          if (matches_any(fsdp_units, name.substr(0, dot))) unit = name.substr(0, dot);
        const int64_t n = p.numel() / (tp.split(name) ? mesh.tp : 1);
        units[unit].first += n * (pc.fsdp.param_dtype == "bf16" ? 2 : 4);
        if (p.requires_grad()) units[unit].second += n * (pc.fsdp.reduce_dtype == "bf16" ? 2 : 4);
      }
    int64_t gathered = 0, unit_grads = 0;
    for (const auto& [unit, b] : units) {
      if (!unit.empty()) gathered = std::max(gathered, b.first);
      unit_grads = std::max(unit_grads, b.second);
    }
    r.data = data_bytes;

    // Activations of one micro-batch on this stage, then the schedule's.
    models::MemoryQuery q;
    q.tp = mesh.tp;
    q.sequence_parallel = pc.sequence_parallel;
    q.vocab_parallel = tp.vocab_parallel_logits;
    q.loss_chunk = tc.loss_chunk_size;
    q.cp_ulysses = cp_layout.ulysses;
    q.cp_ring = cp_layout.ring;
    q.cp_inside = cp_inside;
    if (pipe) {
      std::vector<std::string> held;
      for (int c = 0; c < pipe->num_chunks(); ++c) {
        if (pipe->stage_of(c) != stage) continue;
        for (const auto& piece : pipe->chunks[static_cast<size_t>(c)]) {
          std::string prefix = pipe->submodules[piece.submodule].layer_prefix;
          for (int64_t j = piece.begin; j < piece.end; ++j) held.push_back(prefix + std::to_string(j));
        }
      }
      q.runs = [held](const std::string& block) {
        return std::find(held.begin(), held.end(), block + ".") != held.end() ||
               std::find(held.begin(), held.end(), block) != held.end();
      };
      q.first_stage = stage == 0;
      q.last_stage = stage == mesh.pp - 1;
    }
    auto est = model->estimate_activations(batch, q);
    if (!est && mesh.pp == 1 && mesh.tp == 1 && opt.seq_len == 0)
      est = probe_activations(cfg, vocab, batch, r.params * mesh.dp_shard);
    if (!est)
      throw ConfigError(cat("mm memory: model ", cfg.model.id, " has no activation estimate of its own",
                            opt.seq_len > 0 ? " (and its probe needs the config's data: drop --seq-len)" : ""));
    // Backward meets the blocks last to first: the last one's rebuilt activations (recomputed)
    // and its gradients come on top of everything before it.
    int64_t one = est->before + est->after, rebuilt = 0, work = 0;
    for (const auto& b : est->blocks) {
      const bool again = matches_any(recompute, b.path);
      int64_t kept = again ? b.output : b.saved;
      rebuilt = again ? b.saved - b.output : 0;
      if (!again)  // selective: a recomputed part keeps only its input
        for (const auto& p : b.parts)
          if (matches_any(recompute, b.path + "." + p.name)) {
            kept -= p.saved;
            rebuilt = std::max(rebuilt, p.saved);
          }
      one += kept;
      work = b.backward_work;
    }
    r.terms = est->notes;
    r.terms.emplace_back("blocks (all of this stage's, one micro-batch)", one - est->before - est->after);
    if (tc.precision == "bf16") {
      one /= 2;
      for (auto& term : r.terms) term.second /= 2;
    }
    int in_flight = 1;
    if (pipe) in_flight = max_in_flight(pipeline_schedule(stage, mesh.pp, static_cast<int>(micro), pipe->virtual_chunks));
    const int64_t chunks_here = pipe ? pipe->virtual_chunks : 1;
    r.activations = one * in_flight / chunks_here + est->backward_extra;
    // FSDP: the root unit stays gathered through the step (every unit, without resharding after
    // forward); in backward a unit and those prefetched ahead of it are gathered at once, and two
    // units' full gradients can be alive: one waiting for its reduce-scatter (asynchronous) while
    // the next unit's backward makes its own (measured when a slow peer holds the reduce-scatter
    // back, as context parallelism's ring does).
    int64_t fsdp_forward = 0, fsdp_backward = 0;
    if (fsdp) {
      fsdp_forward = units[""].first;
      if (!pc.fsdp.reshard_after_forward)
        for (const auto& [unit, b] : units) fsdp_forward += unit.empty() ? 0 : b.first;
      const int64_t in_flight = units.size() > 2 ? 2 : 1;  // the root and at least two units
      fsdp_backward = std::max(fsdp_forward, units[""].first + gathered * (1 + std::max<int64_t>(0, pc.fsdp.prefetch))) +
                      unit_grads * in_flight;
    }
    r.transient = rebuilt + work + fsdp_backward;

    const int64_t base = r.params + r.optimizer + r.data;
    const int64_t earlier = micro > 1 ? r.grads : 0;  // earlier micro-batches' gradients (pipelines too)
    const int64_t forward_end = base + r.activations + earlier + fsdp_forward;
    // (The head's activations freed by then, as `one` counts them: halved under bf16.)
    const int64_t after = tc.precision == "bf16" ? est->after / 2 : est->after;
    const int64_t rebuild = base + r.activations - after - est->backward_extra + rebuilt + work + earlier + fsdp_backward;
    const int64_t backward_end = base + r.grads * (ddp ? 2 : 1) + fsdp_backward;
    r.peak = std::max({forward_end, rebuild, backward_end});
    r.peak_at = r.peak == forward_end ? "forward's end" : r.peak == rebuild ? "the last block's backward" : "backward's end";
    out.ranks.push_back(std::move(r));
  }
  return out;
}

std::string format_memory_estimate(const MemoryEstimate& e) {
  std::string s = cat("memory estimate: ", e.model, ", ", e.layout, " on ", e.world, " rank", e.world > 1 ? "s" : "",
                      ", micro-batch ", e.batch, "\n");
  for (const auto& r : e.ranks) {
    std::string ranks;
    if (r.ranks.size() > 1 && r.ranks.size() < static_cast<size_t>(e.world)) {
      for (size_t i = 0; i < r.ranks.size(); ++i) ranks += (i ? "," : " (ranks ") + std::to_string(r.ranks[i]);
      ranks += ")";
    }
    s += cat(r.role, ranks, ":\n");
    s += cat("  parameters          ", mib(r.params), "\n");
    s += cat("  gradients           ", mib(r.grads), "\n");
    s += cat("  optimizer state     ", mib(r.optimizer), "\n");
    s += cat("  data                ", mib(r.data), "\n");
    s += cat("  activations         ", mib(r.activations), "\n");
    for (const auto& [name, b] : r.terms) s += cat("    ", name, ": ", mib(b), "\n");
    if (r.transient > 0) s += cat("  transient           ", mib(r.transient), "\n");
    s += cat("  peak                ", mib(r.peak), " (at ", r.peak_at, ")\n");
  }
  for (const auto& n : e.notes) s += "note: " + n + "\n";
  return s;
}

}  // namespace mm::training
