#include "mindspeed_mm/models/common/norm.h"

namespace mm::models {

RMSNorm::RMSNorm(int64_t d, double e, at::ScalarType dtype) : dim(d), eps(e) {
  weight = register_parameter("weight", at::ones({d}, at::TensorOptions().dtype(dtype)));
}

namespace {
bool upcast(const at::Tensor& x) { return x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf; }
}  // namespace

at::Tensor RMSNorm::mean_square(const at::Tensor& x) const {
  return (upcast(x) ? x.to(at::kFloat) : x).pow(2).mean({-1}, /*keepdim=*/true);
}

at::Tensor RMSNorm::normalize(const at::Tensor& x, const at::Tensor& ms) const {
  const at::Tensor h = (upcast(x) ? x.to(at::kFloat) : x) * at::rsqrt(ms + eps);
  return weight * h.to(x.scalar_type());
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  return parallel_forward ? parallel_forward(*this, x) : normalize(x, mean_square(x));
}

LayerNorm::LayerNorm(int64_t d, double e, at::ScalarType dtype) : dim(d), eps(e) {
  weight = register_parameter("weight", at::ones({d}, at::TensorOptions().dtype(dtype)));
  bias = register_parameter("bias", at::zeros({d}, at::TensorOptions().dtype(dtype)));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const { return at::layer_norm(x, {dim}, weight, bias, eps); }

}  // namespace mm::models
