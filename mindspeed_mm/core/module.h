// Module tree: a model is a tree of named modules whose parameter paths are the Hugging Face
// checkpoint names ("model.layers.3.self_attn.q_proj.weight"). We use our own small base
// instead of torch::nn::Module because plans (recompute now; FSDP, LoRA, offload later) must wrap
// a block's forward and swap parameter storage in place, which torch::nn::Module cannot do.
//
// Blocks (decoder layers, vision blocks) derive from Block and are called through Block::call,
// which runs the wrappers that plans installed around the block's own forward. Model code calls
// blocks and knows nothing of the wrappers.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mm::nn {

class Module : public std::enable_shared_from_this<Module> {
 public:
  virtual ~Module() = default;

  // Registers a leaf tensor as a parameter under `name` (no dots). Returns the stored tensor,
  // which shares its TensorImpl with what named_parameters() returns.
  at::Tensor register_parameter(const std::string& name, at::Tensor t, bool requires_grad = true);
  // Registers a non-trainable tensor (not saved in checkpoints unless persistent).
  at::Tensor register_buffer(const std::string& name, at::Tensor t, bool persistent = false);

  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

  // Removes and returns the child `name` (null when there is none): plans that add children
  // (LoRA's adapters) take them out of the tree for a moment.
  std::shared_ptr<Module> take_module(const std::string& name);

  // Parameters with full dotted paths, in registration order (depth first).
  std::vector<std::pair<std::string, at::Tensor>> named_parameters(const std::string& prefix = "") const;
  std::vector<at::Tensor> parameters() const;
  // Persistent buffers with full dotted paths.
  std::vector<std::pair<std::string, at::Tensor>> named_buffers(const std::string& prefix = "") const;
  // All modules with their paths; the root has path `prefix` ("" by default).
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules(const std::string& prefix = "");
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  // Parameters registered directly on this module (not children), with local names.
  const std::vector<std::pair<std::string, at::Tensor>>& local_parameters() const { return params_; }

  // Moves/casts every parameter and buffer in place (set_data keeps the TensorImpl shared).
  void to(at::ScalarType dtype);
  void to(at::Device device);
  void zero_grad();
  int64_t num_parameters() const;

  // Short type name for printing ("Qwen2DecoderLayer").
  virtual std::string type_name() const { return "Module"; }

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  struct Buffer { std::string name; at::Tensor t; bool persistent; };
  std::vector<Buffer> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

struct KVCache;  // mindspeed_mm/models/common/kv_cache.h

// What a block needs besides its input hidden states. Models fill the fields they use; copies
// are cheap (tensors are reference counted) and a wrapper may keep one alive until backward.
struct ForwardContext {
  at::Tensor cos, sin;        // rotary tables, broadcastable to [batch, heads, seq, head_dim]
  at::Tensor attn_mask;       // optional additive or boolean mask [batch|1, 1, q, k]
  at::Tensor cu_seqlens;      // optional cumulative sequence lengths (packed / variable length)
  int64_t max_seqlen = 0;     // the longest segment of cu_seqlens (when it is on the device)
  bool causal = true;
  // Conditioning a diffusion transformer's blocks read: the cross-attention inputs [B, L, dim]
  // (the text) and the per-sample modulation [B, 6, dim] (the timestep's projection).
  at::Tensor context, modulation;
  KVCache* kv_cache = nullptr;  // inference only; never recomputed
  int64_t layer_index = -1;
};

using BlockFn = std::function<at::Tensor(const at::Tensor&)>;

// A module inside a block whose forward a plan may run another way: selective recompute runs an
// attention or an MLP checkpointed while the rest of its block keeps its activations. Its
// forward hands `through` its input and its own computation (which `through` calls, now and
// perhaps again in backward, so the computation must own what it uses).
class ForwardThrough {
 public:
  virtual ~ForwardThrough() = default;
  std::function<at::Tensor(const at::Tensor&, const BlockFn&)> through;  // empty: run directly
};
// The rest of a block's chain: input and context in, output out.
using BlockCtxFn = std::function<at::Tensor(const at::Tensor&, const ForwardContext&)>;
// A wrapper receives the block, its input and context, and a callable running the rest of the
// chain (which it calls with the context, or with a copy whose tensors it replaced: recompute
// re-runs the block on detached copies of the differentiable ones).
using BlockWrapper = std::function<at::Tensor(class Block&, const at::Tensor&, const ForwardContext&, const BlockCtxFn&)>;

class Block : public Module {
 public:
  // Runs the installed wrappers (outermost first), then forward().
  at::Tensor call(const at::Tensor& x, const ForwardContext& ctx);
  virtual at::Tensor forward(const at::Tensor& x, const ForwardContext& ctx) = 0;

  void add_wrapper(std::string tag, BlockWrapper w) { wrappers_.emplace_back(std::move(tag), std::move(w)); }
  // Outside every wrapper installed so far (context parallelism shards a sequence before tensor
  // parallelism's sequence split takes its share of it).
  void add_outer_wrapper(std::string tag, BlockWrapper w) {
    wrappers_.insert(wrappers_.begin(), {std::move(tag), std::move(w)});
  }
  bool has_wrapper(const std::string& tag) const;

 private:
  std::vector<std::pair<std::string, BlockWrapper>> wrappers_;
};

}  // namespace mm::nn
