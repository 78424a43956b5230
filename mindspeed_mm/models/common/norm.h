// RMSNorm as in HF Qwen2RMSNorm / LlamaRMSNorm: y = w * (x / sqrt(mean(x^2) + eps)).
// LayerNorm as torch.nn.LayerNorm: y = w * (x - mean) / sqrt(var + eps) + b (vision towers).
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "mindspeed_mm/core/module.h"

namespace mm::models {

class RMSNorm : public mm::nn::Module {
 public:
  RMSNorm(int64_t dim, double eps, at::ScalarType dtype = at::kFloat);
  // Reduced-precision inputs are normalised in fp32 and cast back before the weight multiplies
  // (HF's order); fp32/fp64 inputs are computed in their own dtype.
  at::Tensor forward(const at::Tensor& x) const;
  std::string type_name() const override { return "RMSNorm"; }
  // The mean of squares over the feature dimension (fp32 for reduced-precision inputs).
  at::Tensor mean_square(const at::Tensor& x) const;
  // x / sqrt(ms + eps) times the weight, in x's dtype as forward.
  at::Tensor normalize(const at::Tensor& x, const at::Tensor& ms) const;

  int64_t dim;
  double eps;
  at::Tensor weight;
  // Set by a tensor-parallel plan (colwise_norm) whose features are split over ranks: the mean of
  // squares then spans every rank's features.
  std::function<at::Tensor(const RMSNorm&, const at::Tensor&)> parallel_forward;
};

class LayerNorm : public mm::nn::Module {
 public:
  LayerNorm(int64_t dim, double eps, at::ScalarType dtype = at::kFloat);
  at::Tensor forward(const at::Tensor& x) const;
  std::string type_name() const override { return "LayerNorm"; }

  int64_t dim;
  double eps;
  at::Tensor weight, bias;
};

}  // namespace mm::models
