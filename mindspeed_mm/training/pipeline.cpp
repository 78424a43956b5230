#include "mindspeed_mm/training/pipeline.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/training/train_step.h"

namespace mm::training {
namespace {

std::string key_of(const models::PipelineSubmodule& s) { return "parallel.pipeline_num_layers." + s.name; }

// counts[sub][chunk] from the config's lists.
std::vector<std::vector<int64_t>> layer_counts(const std::vector<models::PipelineSubmodule>& subs,
                                               const nlohmann::json& cfg, int pp, int vp) {
  const int C = pp * vp;
  std::vector<std::vector<int64_t>> counts(subs.size(), std::vector<int64_t>(static_cast<size_t>(C), 0));
  std::string names;
  for (const auto& s : subs) names += (names.empty() ? "" : ", ") + s.name;
  if (cfg.is_null() || (cfg.is_object() && cfg.empty())) {
    for (size_t i = 0; i + 1 < subs.size(); ++i) counts[i][0] = subs[i].num_layers;
    const auto& last = subs.back();
    if (last.num_layers < C)
      throw ConfigError(cat("config: parallel.pipeline_num_layers: ", last.name, " has ", last.num_layers,
                            " layers, fewer than the ", pp, " stages x ", vp, " virtual chunks = ", C,
                            " chunks to split them over"));
    const int64_t base = last.num_layers / C, rem = last.num_layers % C;
    for (int c = 0; c < C; ++c) counts.back()[static_cast<size_t>(c)] = base + (c >= C - rem ? 1 : 0);
    return counts;
  }
  if (!cfg.is_object())
    throw ConfigError(cat("config: parallel.pipeline_num_layers must map the model's submodules (", names,
                          ") to layer counts per stage (got ", cfg.dump(), ")"));
  for (auto& [k, v] : cfg.items())
    if (std::none_of(subs.begin(), subs.end(), [&](const auto& s) { return s.name == k; }))
      throw ConfigError(cat("config: parallel.pipeline_num_layers.", k, ": the model has no submodule '", k,
                            "' (it has ", names, ")"));
  for (size_t i = 0; i < subs.size(); ++i) {
    const std::string key = key_of(subs[i]);
    if (!cfg.contains(subs[i].name))
      throw ConfigError(cat("config: parallel.pipeline_num_layers has no '", subs[i].name, "' (list every submodule: ", names,
                            ")"));
    const nlohmann::json& v = cfg.at(subs[i].name);
    // vp 1: [pp counts] (or [[pp counts]]); vp > 1: [vp][pp].
    std::vector<std::vector<int64_t>> rows;
    auto row = [&](const nlohmann::json& r) {
      if (!r.is_array() || r.size() != static_cast<size_t>(pp) ||
          std::any_of(r.begin(), r.end(), [](const nlohmann::json& x) { return !x.is_number_integer() || x.get<int64_t>() < 0; }))
        throw ConfigError(cat("config: ", key, " needs ", pp, " non-negative layer counts per list, one per stage (got ",
                              r.dump(), ")"));
      return r.get<std::vector<int64_t>>();
    };
    if (v.is_array() && !v.empty() && v[0].is_array()) {
      for (const auto& r : v) rows.push_back(row(r));
    } else {
      rows.push_back(row(v));
    }
    if (rows.size() != static_cast<size_t>(vp))
      throw ConfigError(cat("config: ", key, " has ", rows.size(), " list(s) of stages; virtual_pipeline_size ", vp, " needs ", vp,
                            " ([virtual chunk][stage])"));
    int64_t total = 0;
    for (int v_i = 0; v_i < vp; ++v_i)
      for (int s = 0; s < pp; ++s) {
        counts[i][static_cast<size_t>(v_i * pp + s)] = rows[static_cast<size_t>(v_i)][static_cast<size_t>(s)];
        total += rows[static_cast<size_t>(v_i)][static_cast<size_t>(s)];
      }
    if (total != subs[i].num_layers)
      throw ConfigError(cat("config: ", key, " sums to ", total, " layers, but the model's ", subs[i].name, " has ",
                            subs[i].num_layers));
  }
  if (vp > 1)
    for (int c = 0; c < C; ++c) {
      int64_t n = 0;
      for (const auto& sc : counts) n += sc[static_cast<size_t>(c)];
      if (n == 0)
        throw ConfigError(cat("config: parallel.pipeline_num_layers: virtual chunk ", c / pp, " of stage ", c % pp,
                              " holds no layers (interleaving needs at least one per chunk; lower virtual_pipeline_size)"));
    }
  return counts;
}

int chunk_of_layer(const std::vector<int64_t>& counts, int64_t layer) {
  int64_t at = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    at += counts[c];
    if (layer < at) return static_cast<int>(c);
  }
  return static_cast<int>(counts.size()) - 1;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

}  // namespace

bool PipelineLayout::held_by(const std::string& name, int stage) const {
  auto it = owners.find(name);
  if (it == owners.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(), [&](int c) { return stage_of(c) == stage; });
}

bool PipelineLayout::first_holder(const std::string& name, int stage) const {
  auto it = owners.find(name);
  if (it == owners.end()) return false;
  int first = stages;
  for (int c : it->second) first = std::min(first, stage_of(c));
  return first == stage;
}

std::vector<std::string> PipelineLayout::shared() const {
  std::vector<std::string> out;
  for (const auto& [name, chunks] : owners) {
    std::set<int> st;
    for (int c : chunks) st.insert(stage_of(c));
    if (st.size() > 1) out.push_back(name);
  }
  return out;
}

std::string PipelineLayout::describe() const {
  std::string out;
  for (int s = 0; s < stages; ++s) {
    std::string line;
    for (int c = s; c < num_chunks(); c += stages)
      for (const auto& p : chunks[static_cast<size_t>(c)]) {
        line += cat(line.empty() ? "" : ", ", submodules[p.submodule].name, " ", p.begin);
        if (p.end - p.begin > 1) line += cat("-", p.end - 1);
      }
    out += cat(out.empty() ? "" : " | ", "stage ", s, ": ", line.empty() ? "no layers" : line);
  }
  return out;
}

int resolve_virtual_pipeline_size(const models::Model& model, const config::ParallelConfig& p) {
  const int64_t n = p.num_layers_per_virtual_pipeline_stage;
  if (n == 0) return static_cast<int>(p.virtual_pipeline_size);
  const auto subs = model.pipeline_submodules();
  if (subs.empty())
    throw ConfigError(cat("config: parallel.num_layers_per_virtual_pipeline_stage: model ", model.type_name(),
                          " has no pipeline pieces"));
  const auto& lm = subs.back();
  const int64_t per_stage = p.pipeline_parallel_size * n;
  if (lm.num_layers % per_stage != 0)
    throw ConfigError(cat("config: parallel.num_layers_per_virtual_pipeline_stage ", n, ": ", lm.name, "'s ", lm.num_layers,
                          " layers are not a multiple of pipeline_parallel_size ", p.pipeline_parallel_size, " x ", n,
                          " = ", per_stage));
  const int64_t vp = lm.num_layers / per_stage;
  if (p.virtual_pipeline_size != 1 && p.virtual_pipeline_size != vp)
    throw ConfigError(cat("config: parallel.num_layers_per_virtual_pipeline_stage ", n, " makes ", vp,
                          " virtual chunks (", lm.num_layers, " ", lm.name, " layers / ", per_stage,
                          "), but virtual_pipeline_size is ", p.virtual_pipeline_size, " (set one of them)"));
  return static_cast<int>(vp);
}

PipelineLayout make_pipeline_layout(const models::Model& model, const nlohmann::json& num_layers, int pp, int vp) {
  PipelineLayout l;
  l.stages = pp;
  l.virtual_chunks = vp;
  l.submodules = model.pipeline_submodules();
  if (l.submodules.empty())
    throw ConfigError(cat("config: parallel.pipeline_parallel_size ", pp, ": model ", model.type_name(),
                          " has no pipeline pieces"));
  const auto counts = layer_counts(l.submodules, num_layers, pp, vp);
  const int C = pp * vp;
  // Submodules run in order: every chunk with an earlier submodule's layers precedes (or is) the
  // first chunk with a later one's.
  for (size_t i = 0; i < counts.size(); ++i)
    for (size_t j = i + 1; j < counts.size(); ++j) {
      int last_i = -1, first_j = C;
      for (int c = 0; c < C; ++c) {
        if (counts[i][static_cast<size_t>(c)] > 0) last_i = c;
        if (counts[j][static_cast<size_t>(c)] > 0) first_j = std::min(first_j, c);
      }
      if (last_i > first_j)
        throw ConfigError(cat("config: parallel.pipeline_num_layers: ", l.submodules[i].name, " layers on stage ",
                              last_i % pp, " come after ", l.submodules[j].name, " layers on stage ", first_j % pp,
                              " (chunk ", last_i, " vs ", first_j, "); the forward pass runs ", l.submodules[i].name,
                              " before ", l.submodules[j].name));
    }
  l.chunks.resize(static_cast<size_t>(C));
  for (size_t i = 0; i < counts.size(); ++i) {
    int64_t start = 0;
    for (int c = 0; c < C; ++c) {
      const int64_t n = counts[i][static_cast<size_t>(c)];
      if (n > 0) l.chunks[static_cast<size_t>(c)].push_back({i, start, start + n});
      start += n;
    }
  }
  for (auto& ch : l.chunks)
    std::stable_sort(ch.begin(), ch.end(), [](const PipelinePiece& a, const PipelinePiece& b) { return a.submodule < b.submodule; });
  // Owners: a layer's parameters its chunk; the parts before / after a submodule's layers the
  // chunk of its first / last layer.
  for (const auto& [name, p] : model.named_parameters()) {
    std::set<int> own;
    for (size_t i = 0; i < l.submodules.size(); ++i) {
      const auto& s = l.submodules[i];
      if (starts_with(name, s.layer_prefix)) {
        const std::string rest = name.substr(s.layer_prefix.size());
        const auto dot = rest.find('.');
        own.insert(chunk_of_layer(counts[i], std::stoll(rest.substr(0, dot))));
      }
      for (const auto& b : s.before)
        if (starts_with(name, b)) own.insert(chunk_of_layer(counts[i], 0));
      for (const auto& a : s.after)
        if (starts_with(name, a)) own.insert(chunk_of_layer(counts[i], s.num_layers - 1));
    }
    MM_CHECK(!own.empty(), "pipeline: parameter ", name, " belongs to no part of the model's pipeline submodules");
    l.owners[name] = std::vector<int>(own.begin(), own.end());
  }
  return l;
}

std::vector<PipelineAction> pipeline_schedule(int stage, int stages, int micro_batches, int vp) {
  const int pp = stages, m = micro_batches, total = m * vp;
  int warmup = std::min(pp - stage - 1, m);
  if (vp > 1) {
    if (m % pp != 0)
      throw ConfigError(cat("config: interleaved pipeline (virtual_pipeline_size ", vp, "): the micro-batches of a step ",
                            "(training.gradient_accumulation_steps ", m, ") must be a multiple of pipeline_parallel_size ", pp));
    warmup = std::min((pp - stage - 1) * 2 + (vp - 1) * pp, total);
  }
  auto at = [&](int k, bool forward) {
    const int group = k % (pp * vp);
    const int v = forward ? group / pp : vp - 1 - group / pp;
    return PipelineAction{forward, (k / (pp * vp)) * pp + k % pp, v * pp + stage};
  };
  std::vector<PipelineAction> out;
  for (int k = 0; k < warmup; ++k) out.push_back(at(k, true));
  const int steady = total - warmup;
  for (int i = 0; i < steady; ++i) {
    out.push_back(at(warmup + i, true));
    out.push_back(at(i, false));
  }
  for (int k = steady; k < total; ++k) out.push_back(at(k, false));
  return out;
}

int max_in_flight(const std::vector<PipelineAction>& actions) {
  int now = 0, most = 0;
  for (const auto& a : actions) {
    now += a.forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

std::string print_schedule(int stages, int micro_batches, int vp, double* bubble) {
  const int C = stages * vp;
  std::vector<std::vector<PipelineAction>> acts;
  for (int s = 0; s < stages; ++s) acts.push_back(pipeline_schedule(s, stages, micro_batches, vp));
  // Finish times of F(m, c) and B(m, c); a stage runs its actions in order, each as soon as its
  // input is there: F after F(m, c - 1), B after B(m, c + 1) (the last chunk: after its own F).
  std::map<std::tuple<bool, int, int>, int> done;
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<int> free_at(static_cast<size_t>(stages), 0);
  std::vector<std::string> line(static_cast<size_t>(stages));
  std::vector<std::string> who(static_cast<size_t>(stages));
  bool progress = true;
  size_t left = 0;
  for (auto& a : acts) left += a.size();
  while (left > 0) {
    MM_CHECK(progress, "pipeline schedule: stages wait on each other (a deadlock) with ", stages, " stages, ",
             micro_batches, " micro-batches, ", vp, " virtual chunks");
    progress = false;
    for (int s = 0; s < stages; ++s) {
      auto& a = acts[static_cast<size_t>(s)];
      while (next[static_cast<size_t>(s)] < a.size()) {
        const PipelineAction& x = a[next[static_cast<size_t>(s)]];
        int ready = 0;
        if (x.forward && x.chunk > 0) {
          auto it = done.find({true, x.micro, x.chunk - 1});
          if (it == done.end()) break;
          ready = it->second;
        } else if (!x.forward) {
          auto it = x.chunk + 1 < C ? done.find({false, x.micro, x.chunk + 1}) : done.find({true, x.micro, x.chunk});
          if (it == done.end()) break;
          ready = it->second;
        }
        const int start = std::max(ready, free_at[static_cast<size_t>(s)]);
        const int len = x.forward ? 1 : 2;
        std::string& l = line[static_cast<size_t>(s)];
        std::string& w = who[static_cast<size_t>(s)];
        while (static_cast<int>(l.size()) < start) l += '.', w += ' ';
        const char tag = vp > 1 ? static_cast<char>('a' + x.chunk / stages) : ' ';
        for (int t = 0; t < len; ++t) {
          l += x.forward ? 'F' : 'B';
          w += t == 0 ? std::to_string(x.micro % 10)[0] : tag;
        }
        free_at[static_cast<size_t>(s)] = start + len;
        done[{x.forward, x.micro, x.chunk}] = start + len;
        ++next[static_cast<size_t>(s)];
        --left;
        progress = true;
      }
    }
  }
  size_t T = 0;
  for (auto& l : line) T = std::max(T, l.size());
  std::ostringstream out;
  int busy = 0;
  for (int s = 0; s < stages; ++s) {
    std::string l = line[static_cast<size_t>(s)], w = who[static_cast<size_t>(s)];
    busy += static_cast<int>(std::count_if(l.begin(), l.end(), [](char c) { return c != '.'; }));
    l.resize(T, '.');
    w.resize(T, ' ');
    out << "stage " << s << " |" << l << "|\n        |" << w << "|\n";
  }
  const double b = 1.0 - static_cast<double>(busy) / (static_cast<double>(T) * stages);
  if (bubble) *bubble = b;
  out << "F forward (1 slot), B backward (2 slots), . idle; below: micro-batch" << (vp > 1 ? " and chunk (a, b, ...)" : "")
      << "\nbubble " << b << " of the step; 1F1B's (p - 1) / (m + p - 1) = "
      << static_cast<double>(stages - 1) / (micro_batches + stages - 1) << "\n";
  return out.str();
}

// ---------------------------------------------------------------------------------------------

PipelineRunner::PipelineRunner(models::Model& model, PipelineLayout layout, std::shared_ptr<parallel::Communicator> pp)
    : model_(model), layout_(std::move(layout)), pp_(std::move(pp)), stage_(pp_ ? pp_->rank() : 0) {}

void PipelineRunner::run_chunk(int chunk, models::Outputs& carry, const data::Batch& batch) {
  for (const auto& p : layout_.chunks[static_cast<size_t>(chunk)])
    model_.pipeline_forward(p.submodule, p.begin, p.end, carry, batch);
}

namespace {

// Tags keep every message of a step apart: (micro, chunk, direction, slot).
int tag_of(int micro, int chunk, bool backward, int slot) { return ((micro * 64 + chunk) * 2 + (backward ? 1 : 0)) * 64 + slot; }

// Where a batch's tensors are: its first field that moved with it (host fields stay on the CPU).
at::Device batch_device(const data::Batch& b) {
  for (const auto& f : b.fields())
    if (!f.host && f.tensor.defined()) return f.tensor.device();
  return at::kCPU;
}

}  // namespace

void PipelineRunner::send_carry(const models::Outputs& carry, int to, int tag,
                                std::vector<std::shared_ptr<parallel::PendingWork>>& sends) {
  nlohmann::json meta = nlohmann::json::array();
  std::vector<at::Tensor> tensors;
  for (const auto& f : carry.fields()) {
    meta.push_back({{"name", f.name},
                    {"shape", f.tensor.sizes().vec()},
                    {"dtype", static_cast<int>(f.tensor.scalar_type())},
                    {"grad", f.tensor.requires_grad()}});
    tensors.push_back(f.tensor.detach().contiguous());
  }
  const std::string text = meta.dump();
  at::Tensor header = at::tensor(std::vector<int64_t>{static_cast<int64_t>(text.size())}, at::kLong);
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  const at::Device device = tensors.empty() ? at::Device(at::kCPU) : tensors.front().device();
  sends.push_back(pp_->isend(header.to(device), to, tag));
  sends.push_back(pp_->isend(bytes.to(device), to, tag + 1));
  for (size_t i = 0; i < tensors.size(); ++i) sends.push_back(pp_->isend(tensors[i], to, tag + 2 + static_cast<int>(i)));
}

models::Outputs PipelineRunner::recv_carry(int from, int tag, at::Device device) {
  at::Tensor header = at::empty({1}, at::TensorOptions().dtype(at::kLong).device(device));
  pp_->recv(header, from, tag);
  const int64_t n = header.to(at::kCPU).item<int64_t>();
  at::Tensor bytes = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(device));
  pp_->recv(bytes, from, tag + 1);
  bytes = bytes.to(at::kCPU);
  const nlohmann::json meta =
      nlohmann::json::parse(std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n)));
  models::Outputs carry;
  int i = 0;
  for (const auto& m : meta) {
    at::Tensor t = at::empty(m.at("shape").get<std::vector<int64_t>>(),
                             at::TensorOptions().dtype(static_cast<at::ScalarType>(m.at("dtype").get<int>())).device(device));
    pp_->recv(t, from, tag + 2 + i++);
    if (m.at("grad").get<bool>()) t.requires_grad_(true);
    carry.set(m.at("name").get<std::string>(), t);
  }
  return carry;
}

double PipelineRunner::run_step(const std::vector<data::Batch>& micro, const Objective& objective, double normaliser,
                                bool bf16) {
  const int C = layout_.num_chunks(), M = static_cast<int>(micro.size());
  MM_CHECK(M < 1024 && C <= 64, "pipeline: at most 1023 micro-batches and 64 chunks");
  const auto actions = pipeline_schedule(stage_, layout_.stages, M, layout_.virtual_chunks);
  const at::Device device = batch_device(micro.front());
  struct Slot {
    models::Outputs in, out;
    at::Tensor loss;
  };
  std::map<std::pair<int, int>, Slot> live;
  std::vector<std::shared_ptr<parallel::PendingWork>> sends;
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const PipelineAction& a : actions) {
    const data::Batch& batch = micro[static_cast<size_t>(a.micro)];
    if (a.forward) {
      Slot s;
      if (a.chunk > 0) s.in = recv_carry(layout_.stage_of(a.chunk - 1), tag_of(a.micro, a.chunk, false, 0), device);
      models::Outputs carry = s.in;
      if (before_forward_) before_forward_(batch);
      {
        AutocastScope autocast(bf16, device.type());
        run_chunk(a.chunk, carry, batch);
      }
      if (a.chunk == C - 1) {
        at::Tensor sum = objective.loss_sum(carry, batch);
        loss_sum.add_(sum.detach().to(at::kDouble));
        s.loss = sum / normaliser;
      } else {
        send_carry(carry, layout_.stage_of(a.chunk + 1), tag_of(a.micro, a.chunk + 1, false, 0), sends);
        s.out = carry;
      }
      live[{a.micro, a.chunk}] = std::move(s);
      continue;
    }
    Slot s = std::move(live.at({a.micro, a.chunk}));
    live.erase({a.micro, a.chunk});
    if (a.chunk == C - 1) {
      s.loss.backward();
    } else {
      std::vector<at::Tensor> outs, grads;
      int slot = 0;
      for (const auto& f : s.out.fields()) {
        if (f.tensor.requires_grad()) {
          at::Tensor g = at::empty_like(f.tensor, at::MemoryFormat::Contiguous);
          pp_->recv(g, layout_.stage_of(a.chunk + 1), tag_of(a.micro, a.chunk + 1, true, slot));
          outs.push_back(f.tensor);
          grads.push_back(g);
        }
        ++slot;
      }
      if (!outs.empty()) torch::autograd::backward(outs, grads);
    }
    if (a.chunk > 0) {
      int slot = 0;
      for (const auto& f : s.in.fields()) {
        if (f.tensor.requires_grad()) {
          at::Tensor g = f.tensor.grad().defined() ? f.tensor.grad().contiguous() : at::zeros_like(f.tensor);
          sends.push_back(pp_->isend(g, layout_.stage_of(a.chunk - 1), tag_of(a.micro, a.chunk, true, slot)));
        }
        ++slot;
      }
    }
  }
  for (auto& w : sends) w->wait();
  // The loss lives on the last stage; every stage reports it.
  at::Tensor total = loss_sum.to(at::kCPU).reshape({1});
  if (!last_stage()) total.zero_();
  pp_->all_reduce(total);
  return total.item<double>();
}

EvalSums PipelineRunner::eval_sums(const data::Batch& batch, const Objective& objective) {
  at::NoGradGuard no_grad;
  const int C = layout_.num_chunks();
  const at::Device device = batch_device(batch);
  std::vector<std::shared_ptr<parallel::PendingWork>> sends;
  // Loss sum, count and the objective's parts (per timestep bucket), from the last stage.
  const int64_t n_parts = objective.eval_parts_size();
  at::Tensor sums = at::zeros({2 + n_parts}, at::kDouble);
  for (int c = stage_; c < C; c += layout_.stages) {
    models::Outputs carry;
    if (c > 0) carry = recv_carry(layout_.stage_of(c - 1), tag_of(1023, c, false, 0), device);
    if (before_forward_) before_forward_(batch);
    run_chunk(c, carry, batch);
    if (c == C - 1) {
      EvalSums s = objective.eval_sums(carry, batch);
      sums[0] = s.sum.to(at::kCPU, at::kDouble).item<double>();
      sums[1] = s.count.to(at::kCPU, at::kDouble).item<double>();
      if (n_parts > 0) sums.narrow(0, 2, n_parts).copy_(s.parts.to(at::kCPU, at::kDouble));
    } else {
      send_carry(carry, layout_.stage_of(c + 1), tag_of(1023, c + 1, false, 0), sends);
    }
  }
  for (auto& w : sends) w->wait();
  pp_->all_reduce(sums);
  EvalSums out{sums[0].clone(), sums[1].clone()};
  if (n_parts > 0) out.parts = sums.narrow(0, 2, n_parts).clone();
  return out;
}

}  // namespace mm::training
