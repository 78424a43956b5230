#include "mindspeed_mm/models/common/linear.h"

namespace mm::models {

// Parameters start as zeros; models initialise them (init_weights) or load a checkpoint.
Linear::Linear(int64_t in, int64_t out, bool has_bias, at::ScalarType dtype)
    : in_features(in), out_features(out) {
  weight = register_parameter("weight", at::zeros({out, in}, at::TensorOptions().dtype(dtype)));
  if (has_bias) bias = register_parameter("bias", at::zeros({out}, at::TensorOptions().dtype(dtype)));
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  at::Tensor y = parallel_forward ? parallel_forward(*this, x) : at::linear(x, weight, bias);
  return adapter ? y + adapter(*this, x) : y;
}

Embedding::Embedding(int64_t n, int64_t dim, at::ScalarType dtype) : num_embeddings(n), embedding_dim(dim) {
  weight = register_parameter("weight", at::zeros({n, dim}, at::TensorOptions().dtype(dtype)));
}

at::Tensor Embedding::forward(const at::Tensor& ids) const {
  return parallel_forward ? parallel_forward(*this, ids) : at::embedding(weight, ids);
}

at::Tensor Embedding::attend(const at::Tensor& hidden) const {
  return parallel_attend ? parallel_attend(*this, hidden) : at::linear(hidden, weight);
}

}  // namespace mm::models
