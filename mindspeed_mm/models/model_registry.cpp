#include "mindspeed_mm/models/model_registry.h"

namespace mm::models {

mm::Registry<ModelFactory>& model_registry() {
  static mm::Registry<ModelFactory> registry("model");
  return registry;
}

mm::Registry<ModelSizeFn>& model_size_registry() {
  static mm::Registry<ModelSizeFn> registry("model");
  return registry;
}

int64_t ModelSize::total() const {
  int64_t n = 0;
  for (const auto& [_, c] : parts) n += c;
  return n;
}

int64_t real_tokens(const MultimodalInputs& in) {
  if (in.attention_mask.defined()) return in.attention_mask.ne(0).sum().item<int64_t>();
  if (in.segment_ids.defined()) return in.segment_ids.ge(0).sum().item<int64_t>();
  return in.input_ids.numel();
}

double CausalLM::training_flops(const MultimodalInputs& in) const {
  return static_cast<double>(real_tokens(in)) * flops_per_token(in.input_ids.size(-1));
}

}  // namespace mm::models
