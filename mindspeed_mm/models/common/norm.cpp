#include "mindspeed_mm/models/common/norm.h"

namespace mm::models {

RMSNorm::RMSNorm(int64_t d, double e, at::ScalarType dtype) : dim(d), eps(e) {
  weight = register_parameter("weight", at::ones({d}, at::TensorOptions().dtype(dtype)));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  const auto in_dtype = x.scalar_type();
  const bool upcast = in_dtype == at::kBFloat16 || in_dtype == at::kHalf;
  at::Tensor h = upcast ? x.to(at::kFloat) : x;
  at::Tensor var = h.pow(2).mean({-1}, /*keepdim=*/true);
  h = h * at::rsqrt(var + eps);
  return weight * h.to(in_dtype);
}

LayerNorm::LayerNorm(int64_t d, double e, at::ScalarType dtype) : dim(d), eps(e) {
  weight = register_parameter("weight", at::ones({d}, at::TensorOptions().dtype(dtype)));
  bias = register_parameter("bias", at::zeros({d}, at::TensorOptions().dtype(dtype)));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const { return at::layer_norm(x, {dim}, weight, bias, eps); }

}  // namespace mm::models
