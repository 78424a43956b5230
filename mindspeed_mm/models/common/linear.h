// Linear and Embedding layers with Hugging Face parameter names (`weight` [out, in], `bias`).
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "mindspeed_mm/core/module.h"

namespace mm::models {

// y = x W^T + b, W: [out_features, in_features].
class Linear : public mm::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, at::ScalarType dtype = at::kFloat);
  at::Tensor forward(const at::Tensor& x) const;
  std::string type_name() const override { return "Linear"; }

  int64_t in_features, out_features;
  at::Tensor weight, bias;  // bias undefined when constructed without one
  // Set by a parallel plan (training/tensor_parallel_plan.h) to run this layer as a column- or
  // row-parallel piece; model code never sets it.
  std::function<at::Tensor(const Linear&, const at::Tensor&)> parallel_forward;
  // Set by the LoRA plan (training/lora.h): added to the output (x's low-rank update).
  std::function<at::Tensor(const Linear&, const at::Tensor&)> adapter;
};

// Token lookup: weight [num_embeddings, embedding_dim].
class Embedding : public mm::nn::Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, at::ScalarType dtype = at::kFloat);
  at::Tensor forward(const at::Tensor& ids) const;
  // hidden [..., dim] -> [..., num_embeddings] through the same weight (a tied LM head).
  at::Tensor attend(const at::Tensor& hidden) const;
  std::string type_name() const override { return "Embedding"; }

  int64_t num_embeddings, embedding_dim;
  at::Tensor weight;
  // Set by a parallel plan (vocabulary-parallel lookup and tied head); model code never sets them.
  std::function<at::Tensor(const Embedding&, const at::Tensor&)> parallel_forward, parallel_attend;
};

}  // namespace mm::models
