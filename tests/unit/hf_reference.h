// Test helpers around tests/conformance/hf_reference.py: transformers itself (the project's .venv,
// transformers pinned in scripts/install_deps.sh) as the reference for mm's models.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "hf_model_dir.h"
#include "run_command.h"

namespace mm::test {

// Runs `hf_reference.py ARGS`; a failure names the command and shows its output.
inline void run_hf(const std::string& args) {
  const std::string cmd = std::string(MM_PYTHON) + " " + source_dir() + "/tests/conformance/hf_reference.py " + args;
  auto r = run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
}

// max |a - b| / max |b|
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(1e-30, b.to(at::kDouble).abs().max().item<double>());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

// Norm weights to 1 + N(0, 0.3) and biases to N(0, 0.3), away from their init (ones, zeros), so a
// dropped or swapped norm weight or bias shows in the logits.
inline void perturb_norms_and_biases(mm::nn::Module& m, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& [n, p] : m.named_parameters()) {
    const bool norm = p.dim() == 1 && (n.find("norm") != std::string::npos || n.find("ln_q") != std::string::npos) &&
                      n.find(".weight") != std::string::npos;
    const bool bias = n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
    if (!norm && !bias) continue;
    at::Tensor noise = at::empty(p.sizes(), at::TensorOptions().dtype(at::kDouble)).normal_(0.0, 0.3, gen);
    p.copy_(norm ? 1.0 + noise : noise);
  }
}

// mm's model from an HF directory, in `dtype` with the file's values (no rounding through fp32).
inline std::shared_ptr<mm::models::CausalLM> load_hf_model_as(const std::string& dir, at::ScalarType dtype) {
  auto m = load_hf_model(dir);
  if (dtype != at::kFloat) {
    m->to(dtype);
    mm::checkpoint::load_model_weights(*m, dir, {}, [&](const std::string& k) { return m->parameter_name(k); });
  }
  return m;
}

}  // namespace mm::test
