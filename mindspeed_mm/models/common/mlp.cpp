#include "mindspeed_mm/models/common/mlp.h"

#include "mindspeed_mm/core/errors.h"

namespace mm::models {

SwiGLUMLP::SwiGLUMLP(int64_t hidden, int64_t inter, bool bias, at::ScalarType dtype) {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(hidden, inter, bias, dtype));
  up_proj = register_module("up_proj", std::make_shared<Linear>(hidden, inter, bias, dtype));
  down_proj = register_module("down_proj", std::make_shared<Linear>(inter, hidden, bias, dtype));
}

at::Tensor SwiGLUMLP::forward(const at::Tensor& x) const {
  return through ? through(x, [this](const at::Tensor& in) { return forward_own(in); }) : forward_own(x);
}

at::Tensor SwiGLUMLP::forward_own(const at::Tensor& x) const {
  return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

Activation activation_from_name(const std::string& name, const std::string& source) {
  if (name == "quick_gelu") return Activation::kQuickGelu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return Activation::kGeluTanh;
  if (name == "silu" || name == "swish") return Activation::kSilu;
  throw ConfigError(cat("config: hidden_act '", name, "' is not one of quick_gelu, gelu, gelu_pytorch_tanh, gelu_new, silu in ",
                        source));
}

at::Tensor activate(const at::Tensor& x, Activation act) {
  switch (act) {
    case Activation::kQuickGelu: return x * at::sigmoid(1.702 * x);
    case Activation::kGelu: return at::gelu(x);
    case Activation::kGeluTanh: return at::gelu(x, "tanh");
    case Activation::kSilu: return at::silu(x);
  }
  return x;
}

FcMLP::FcMLP(int64_t dim, int64_t hidden, Activation a, at::ScalarType dtype) : act(a) {
  fc1 = register_module("fc1", std::make_shared<Linear>(dim, hidden, true, dtype));
  fc2 = register_module("fc2", std::make_shared<Linear>(hidden, dim, true, dtype));
}

at::Tensor FcMLP::forward(const at::Tensor& x) const { return fc2->forward(activate(fc1->forward(x), act)); }

}  // namespace mm::models
