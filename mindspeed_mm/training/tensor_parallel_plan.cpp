#include "mindspeed_mm/training/tensor_parallel_plan.h"

#include <ATen/core/grad_mode.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/core/pattern.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/linear.h"
#include "mindspeed_mm/models/common/norm.h"
#include "mindspeed_mm/training/plans.h"

namespace mm::training {
namespace {

const std::vector<std::string> kStyles = {"colwise", "rowwise",    "heads",      "kv_colwise",  "qkv_colwise",
                                          "vocab",   "vocab_head", "vocab_tied", "colwise_norm"};

struct Target {
  std::string path, style;
  mm::nn::Module* module;
  bool in_sequence_region = false;
  // kv_colwise: the parent attention's key/value heads and head size, and whether they are
  // replicated (fewer heads than ranks).
  int64_t kv_heads = 0, head_dim = 0;
  bool replicate_kv = false;
};

std::string parent_path(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

bool under(const std::string& path, const std::string& prefix) {
  return path == prefix || (path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0 &&
                            path[prefix.size()] == '.');
}

// A LoRA adapter's child Linear of a target layer (training/lora.h), or null.
models::Linear* lora_of(models::Linear* lin, const char* name) {
  for (auto& [n, c] : lin->children())
    if (n == name) return dynamic_cast<models::Linear*>(c.get());
  return nullptr;
}

}  // namespace

at::Tensor TpLayout::local(const std::string& name, const at::Tensor& full) const {
  auto it = splits.find(name);
  if (it == splits.end()) return full;
  const Split& s = it->second;
  const int64_t chunk = s.view[static_cast<size_t>(s.dim)] / size;
  std::vector<int64_t> local_shape = s.full_shape;
  at::Tensor v = full.reshape(s.view).narrow(s.dim, rank * chunk, chunk);
  // The local tensor's own shape: the full one with its element count divided along the
  // dimension that holds the split (the first dimension the view's split dimension falls in).
  int64_t before = 1;
  for (int64_t d = 0; d < s.dim; ++d) before *= s.view[static_cast<size_t>(d)];
  int64_t acc = 1;
  for (size_t d = 0; d < local_shape.size(); ++d) {
    acc *= local_shape[d];
    if (acc > before) {
      local_shape[d] /= size;
      break;
    }
  }
  return v.reshape(local_shape);
}

checkpoint::TensorBox TpLayout::box(const std::string& name) const {
  auto it = splits.find(name);
  if (it == splits.end()) return {};
  const Split& s = it->second;
  checkpoint::TensorBox b;
  b.view = s.view;
  b.offset.assign(s.view.size(), 0);
  b.sizes = s.view;
  const int64_t chunk = s.view[static_cast<size_t>(s.dim)] / size;
  b.offset[static_cast<size_t>(s.dim)] = rank * chunk;
  b.sizes[static_cast<size_t>(s.dim)] = chunk;
  return b;
}

namespace {

enum class Mode { kApply, kCheck, kRecord };

// kCheck: the targets checked for `n` ranks and nothing changed (no group needed); kRecord: the
// same, and the splits recorded in the layout (where each parameter's slices would be).
TpLayout apply_plan(mm::nn::Module& root, const std::vector<std::pair<std::string, std::string>>& plan,
                    const parallel::TpGroup& tp, int n, int r, const TpOptions& options, Mode mode) {
  const bool check_only = mode == Mode::kCheck, record = mode == Mode::kRecord;
  TpLayout layout;
  layout.size = n;
  layout.rank = r;
  std::vector<PathPattern> patterns;
  for (const auto& [pattern, style] : plan) {
    if (std::find(kStyles.begin(), kStyles.end(), style) == kStyles.end())
      throw ConfigError(cat("config: tensor-parallel plan '", pattern, "': unknown style '", style,
                            "' (colwise, rowwise, heads, kv_colwise, qkv_colwise, vocab, vocab_head, vocab_tied, colwise_norm)"));
    patterns.emplace_back(pattern);
  }
  auto fail = [&](const std::string& path, const std::string& what) -> void {
    throw ConfigError(cat("config: tensor parallel over ", n, " ranks: ", path, " ", what));
  };
  // The sequence-parallel blocks, in module order.
  std::vector<std::pair<std::string, mm::nn::Block*>> seq_blocks;
  if (options.sequence_parallel) {
    std::vector<PathPattern> sp;
    for (const auto& p : options.sequence_parallel_blocks) sp.emplace_back(p);
    for_each_module(root, [&](const std::string& path, mm::nn::Module& m) {
      for (const auto& p : sp)
        if (p.matches(path)) {
          auto* b = dynamic_cast<mm::nn::Block*>(&m);
          if (!b) fail(path, cat("is a ", m.type_name(), ", not a block (sequence parallelism wraps blocks)"));
          seq_blocks.emplace_back(path, b);
          break;
        }
    });
    if (seq_blocks.empty())
      throw ConfigError("config: parallel.sequence_parallel: the model names no blocks whose hidden states can be "
                        "split along the sequence");
  }
  auto in_sequence_region = [&](const std::string& path) {
    for (const auto& [p, _] : seq_blocks)
      if (under(path, p)) return true;
    return false;
  };

  // Every target first, checked, so a bad plan changes nothing.
  std::vector<Target> targets;
  std::vector<bool> used(plan.size(), false);
  std::map<std::string, mm::nn::Module*> modules;
  for_each_module(root, [&](const std::string& path, mm::nn::Module& m) {
    modules[path] = &m;
    for (size_t i = 0; i < plan.size(); ++i) {
      if (!patterns[i].matches(path)) continue;
      used[i] = true;
      const std::string& style = plan[i].second;
      Target t{path, style, &m, in_sequence_region(path)};
      if (style == "heads") {
        auto* h = dynamic_cast<models::HeadSplittable*>(&m);
        if (!h) fail(path, cat("is a ", m.type_name(), ", not an attention module whose heads split"));
        const auto [q, kv] = h->heads();
        if (q % n != 0) fail(path, cat("has ", q, " query heads, which do not divide by ", n));
        if (kv % n != 0 && n % kv != 0)
          fail(path, cat("has ", kv, " key/value heads: they must divide by ", n, " or divide ", n,
                         " (then each rank keeps a copy of one)"));
      } else if (style == "colwise_norm") {
        auto* norm = dynamic_cast<models::RMSNorm*>(&m);
        if (!norm) fail(path, cat("is a ", m.type_name(), ", not an RMSNorm (colwise_norm)"));
        if (norm->dim % n != 0) fail(path, cat("has ", norm->dim, " features, which do not divide by ", n));
      } else if (style == "vocab" || style == "vocab_tied") {
        auto* e = dynamic_cast<models::Embedding*>(&m);
        if (!e) fail(path, cat("is a ", m.type_name(), ", not an Embedding (", style, ")"));
        if (e->num_embeddings % n != 0)
          fail(path, cat("has ", e->num_embeddings, " rows (the vocabulary), which do not divide by ", n,
                         ": set model.config.vocab_size to a multiple of ", n, " (Megatron pads it the same way)"));
      } else {
        auto* lin = dynamic_cast<models::Linear*>(&m);
        if (!lin) fail(path, cat("is a ", m.type_name(), ", not a Linear (", style, ")"));
        if (style == "kv_colwise") {
          auto it = modules.find(parent_path(path));
          auto* h = it == modules.end() ? nullptr : dynamic_cast<models::HeadSplittable*>(it->second);
          if (!h) fail(path, "(kv_colwise) is not inside an attention module whose heads split");
          t.kv_heads = h->heads().second;
          t.head_dim = lin->out_features / t.kv_heads;
          if (t.kv_heads % n != 0 && n % t.kv_heads != 0)
            fail(path, cat("projects ", t.kv_heads, " key/value heads: they must divide by ", n, " or divide ", n));
          t.replicate_kv = t.kv_heads % n != 0;
          if (t.replicate_kv && lora_of(lin, "lora_B"))
            fail(path, cat("carries a LoRA adapter and its ", t.kv_heads, " key/value heads are replicated over ", n,
                           " ranks: LoRA there is not built (use a tensor-parallel size that divides the key/value heads)"));
        } else if (style == "qkv_colwise") {
          if (lin->out_features % (3 * n) != 0)
            fail(path, cat("has ", lin->out_features, " fused q/k/v output features; each third must divide by ", n));
        } else {
          const bool col = style != "rowwise";
          const int64_t features = col ? lin->out_features : lin->in_features;
          if (features % n != 0)
            fail(path, cat("has ", features, col ? " output" : " input", " features, which do not divide by ", n,
                           style == "vocab_head" ? cat(" (the vocabulary): set model.config.vocab_size to a multiple of ", n)
                                                 : std::string()));
        }
      }
      targets.push_back(t);
      break;
    }
  });
  for (size_t i = 0; i < plan.size(); ++i)
    if (!used[i]) throw ConfigError(cat("config: tensor-parallel plan pattern '", plan[i].first, "' matches no module"));
  layout.modules = static_cast<int64_t>(targets.size());
  if (n == 1 || check_only) return layout;

  // Keeps this rank's slice of a parameter (split along `dim` of `view`), recorded in the layout.
  auto keep = [&](const std::string& name, at::Tensor& param, std::vector<int64_t> view, int64_t dim) {
    at::NoGradGuard no_grad;
    TpLayout::Split s;
    s.full_shape = mm::nn::full_shape(param);
    s.view = view.empty() ? s.full_shape : std::move(view);
    s.dim = dim;
    layout.splits[name] = s;
    if (record) return;
    const bool deferred = mm::nn::deferred_value(param).has_value();
    if (deferred) {
      at::Tensor shape_only = layout.local(name, at::empty(s.full_shape, at::TensorOptions().device(at::kMeta)));
      mm::nn::reshape_deferred(param, shape_only.sizes().vec());
    } else {
      param.set_data(layout.local(name, param.detach()).clone(at::MemoryFormat::Contiguous));
    }
    mm::nn::set_full_shape(param, s.full_shape);
  };
  auto input_of = [tp](bool seq) {
    return [tp, seq](const at::Tensor& x) {
      return seq ? parallel::gather_from_sequence_region(x, tp, 1) : parallel::copy_to_tp_region(x, tp);
    };
  };

  for (const Target& t : targets) {
    const std::string pre = t.path.empty() ? "" : t.path + ".";
    if (t.style == "heads") {
      if (record) continue;  // its projections are split by their own entries
      auto* h = dynamic_cast<models::HeadSplittable*>(t.module);
      const auto [q, kv] = h->heads();
      h->keep_heads(q / n, kv % n == 0 ? kv / n : 1);
      continue;
    }
    if (t.style == "colwise_norm") {
      // The features come split from a colwise layer: each rank's mean of squares over its
      // features, scaled by 1/n, summed over the group is the full mean. Its gradient is the sum
      // of every rank's (each rank's output feeds only its own features' downstream work).
      auto* norm = static_cast<models::RMSNorm*>(t.module);
      keep(pre + "weight", norm->weight, {}, 0);
      if (record) continue;
      norm->dim /= n;
      norm->parallel_forward = [tp, n](const models::RMSNorm& m, const at::Tensor& x) {
        const at::Tensor part = m.mean_square(x) / static_cast<double>(n);
        return m.normalize(x, parallel::reduce_from_tp_region(parallel::copy_to_tp_region(part, tp), tp));
      };
      continue;
    }
    if (t.style == "vocab" || t.style == "vocab_tied") {
      auto* e = static_cast<models::Embedding*>(t.module);
      keep(pre + "weight", e->weight, {}, 0);
      if (record) continue;
      const int64_t rows = e->num_embeddings / n, first = r * rows;
      e->parallel_forward = [tp, rows, first](const models::Embedding& m, const at::Tensor& ids) {
        const at::Tensor local = ids - first;
        const at::Tensor outside = local.lt(0).logical_or(local.ge(rows));
        at::Tensor out = at::embedding(m.weight, local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0);
        return parallel::reduce_from_tp_region(out, tp);
      };
      if (t.style == "vocab_tied") {
        e->parallel_attend = [tp](const models::Embedding& m, const at::Tensor& h) {
          return at::linear(parallel::copy_to_tp_region(h, tp), m.weight);
        };
        layout.vocab_parallel_logits = true;
      }
      continue;
    }
    auto* lin = static_cast<models::Linear*>(t.module);
    const auto in = input_of(t.in_sequence_region);
    if (t.style == "rowwise") {
      keep(pre + "weight", lin->weight, {}, 1);  // the bias stays whole, added once after the sum
      if (auto* a = lora_of(lin, "lora_A")) {
        // LoRA: A takes this rank's input features; the partial products summed, B whole.
        keep(pre + "lora_A.weight", a->weight, {}, 1);
        if (!record) {
          a->in_features /= n;
          a->parallel_forward = [tp](const models::Linear& l, const at::Tensor& x) {
            return parallel::reduce_from_tp_region(at::linear(x, l.weight), tp);
          };
        }
      }
      if (record) continue;
      lin->in_features /= n;
      const bool seq = t.in_sequence_region;
      lin->parallel_forward = [tp, seq](const models::Linear& l, const at::Tensor& x) {
        at::Tensor y = at::linear(x, l.weight);
        y = seq ? parallel::reduce_scatter_to_sequence_region(y, tp, 1) : parallel::reduce_from_tp_region(y, tp);
        return l.bias.defined() ? y + l.bias : y;
      };
      continue;
    }
    if (t.style == "kv_colwise" && t.replicate_kv) {
      if (record) continue;  // whole on every rank
      // Whole weight on every rank; this rank's key/value head picked from the output. Each rank's
      // weight gradient covers only its head's rows: summed over the group after backward.
      const int64_t head = r / (n / t.kv_heads), width = t.head_dim;
      layout.partial_grads.insert(pre + "weight");
      if (lin->bias.defined()) layout.partial_grads.insert(pre + "bias");
      lin->out_features = width;
      lin->parallel_forward = [in, head, width](const models::Linear& l, const at::Tensor& x) {
        return at::linear(in(x), l.weight, l.bias).narrow(-1, head * width, width);
      };
      continue;
    }
    if (t.style == "qkv_colwise") {
      const int64_t third = lin->out_features / 3;
      keep(pre + "weight", lin->weight, {3, third, lin->in_features}, 1);
      if (lin->bias.defined()) keep(pre + "bias", lin->bias, {3, third}, 1);
    } else {  // colwise, kv_colwise (heads divide), vocab_head
      keep(pre + "weight", lin->weight, {}, 0);
      if (lin->bias.defined()) keep(pre + "bias", lin->bias, {}, 0);
    }
    if (auto* b = lora_of(lin, "lora_B")) {
      // LoRA: B's rows split as the layer's outputs; A whole. B's input goes through copy_to, so
      // the gradient reaching A (and the layer's input through it) is the whole one on every rank.
      if (t.style == "qkv_colwise") keep(pre + "lora_B.weight", b->weight, {3, lin->out_features / 3, b->in_features}, 1);
      else keep(pre + "lora_B.weight", b->weight, {}, 0);
      if (!record) {
        b->out_features /= n;
        b->parallel_forward = [tp](const models::Linear& l, const at::Tensor& h) {
          return at::linear(parallel::copy_to_tp_region(h, tp), l.weight);
        };
      }
    }
    if (record) continue;
    lin->out_features /= n;
    const auto head_in = t.style == "vocab_head" ? input_of(false) : in;  // the head's input is whole
    if (t.style == "vocab_head") layout.vocab_parallel_logits = true;
    lin->parallel_forward = [head_in](const models::Linear& l, const at::Tensor& x) {
      return at::linear(head_in(x), l.weight, l.bias);
    };
  }

  if (!seq_blocks.empty() && !record) {
    // Every replicated parameter inside the sequence-parallel blocks sees only this rank's tokens.
    for (const auto& [path, block] : seq_blocks)
      for (auto& [name, p] : block->named_parameters(path))
        if (!layout.split(name)) layout.partial_grads.insert(name);
    mm::nn::Block* first = seq_blocks.front().second;
    mm::nn::Block* last = seq_blocks.back().second;
    first->add_wrapper("sequence_parallel_enter", [tp, n](mm::nn::Block&, const at::Tensor& x,
                                                          const mm::nn::ForwardContext& c, const mm::nn::BlockCtxFn& f) {
      if (x.size(1) % n != 0)
        throw ConfigError(cat("config: parallel.sequence_parallel: a batch's sequence length ", x.size(1),
                              " does not divide by tensor_parallel_size ", n,
                              " (set data.seq_len to a multiple; multimodal batches are padded to one)"));
      return f(parallel::scatter_to_sequence_region(x, tp, 1), c);
    });
    last->add_wrapper("sequence_parallel_leave", [tp](mm::nn::Block&, const at::Tensor& x, const mm::nn::ForwardContext& c,
                                                      const mm::nn::BlockCtxFn& f) {
      return parallel::gather_from_sequence_to_whole(f(x, c), tp, 1);
    });
  }
  return layout;
}

}  // namespace

TpLayout apply_tensor_parallel_plan(mm::nn::Module& root, const std::vector<std::pair<std::string, std::string>>& plan,
                                    const parallel::TpGroup& tp, const TpOptions& options) {
  return apply_plan(root, plan, tp, tp ? tp->size() : 1, tp ? tp->rank() : 0, options, Mode::kApply);
}

TpLayout tensor_parallel_splits(mm::nn::Module& root, const std::vector<std::pair<std::string, std::string>>& plan,
                                int size) {
  return apply_plan(root, plan, nullptr, size, 0, {}, Mode::kRecord);
}

void check_tensor_parallel_plan(mm::nn::Module& root, const std::vector<std::pair<std::string, std::string>>& plan,
                                int size, const TpOptions& options) {
  apply_plan(root, plan, nullptr, size, 0, options, Mode::kCheck);
}

}  // namespace mm::training
