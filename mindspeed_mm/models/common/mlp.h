// Feed-forward blocks.
//   SwiGLUMLP (Llama/Qwen2 MLP): down_proj(silu(gate_proj(x)) * up_proj(x)).
//   FcMLP (ViT / CLIP / Qwen2-VL vision MLP): fc2(act(fc1(x))), both with bias.
#pragma once

#include <memory>
#include <string>

#include "mindspeed_mm/models/common/linear.h"

namespace mm::models {

class SwiGLUMLP : public mm::nn::Module, public mm::nn::ForwardThrough {
 public:
  SwiGLUMLP(int64_t hidden, int64_t intermediate, bool bias = false, at::ScalarType dtype = at::kFloat);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor forward_own(const at::Tensor& x) const;  // forward, not through a plan
  std::string type_name() const override { return "SwiGLUMLP"; }

  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

// HF's ACT2FN names: quick_gelu (x * sigmoid(1.702 x), CLIP/Qwen2-VL), gelu (erf),
// gelu_pytorch_tanh / gelu_new (tanh approximation), silu.
enum class Activation { kQuickGelu, kGelu, kGeluTanh, kSilu };
// mm::ConfigError naming `source` for an unknown name.
Activation activation_from_name(const std::string& name, const std::string& source);
at::Tensor activate(const at::Tensor& x, Activation act);

class FcMLP : public mm::nn::Module {
 public:
  FcMLP(int64_t dim, int64_t hidden, Activation act, at::ScalarType dtype = at::kFloat);
  at::Tensor forward(const at::Tensor& x) const;
  std::string type_name() const override { return "FcMLP"; }

  Activation act;
  std::shared_ptr<Linear> fc1, fc2;
};

}  // namespace mm::models
