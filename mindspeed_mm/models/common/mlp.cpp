#include "mindspeed_mm/models/common/mlp.h"

namespace mm::models {

SwiGLUMLP::SwiGLUMLP(int64_t hidden, int64_t inter, bool bias, at::ScalarType dtype) {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(hidden, inter, bias, dtype));
  up_proj = register_module("up_proj", std::make_shared<Linear>(hidden, inter, bias, dtype));
  down_proj = register_module("down_proj", std::make_shared<Linear>(inter, hidden, bias, dtype));
}

at::Tensor SwiGLUMLP::forward(const at::Tensor& x) const {
  return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

}  // namespace mm::models
