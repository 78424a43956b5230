// SwiGLU feed-forward (Llama/Qwen2 MLP): down_proj(silu(gate_proj(x)) * up_proj(x)).
#pragma once

#include <memory>

#include "mindspeed_mm/models/common/linear.h"

namespace mm::models {

class SwiGLUMLP : public mm::nn::Module {
 public:
  SwiGLUMLP(int64_t hidden, int64_t intermediate, bool bias = false, at::ScalarType dtype = at::kFloat);
  at::Tensor forward(const at::Tensor& x) const;
  std::string type_name() const override { return "SwiGLUMLP"; }

  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

}  // namespace mm::models
