#include "mindspeed_mm/models/common/cross_entropy.h"

#include <ATen/core/Reduction.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "mindspeed_mm/core/errors.h"

namespace mm::models {

namespace {

// Logits as [tokens, vocab] (fp32 when stored in half precision) and labels as [tokens] longs.
std::pair<at::Tensor, at::Tensor> flat_logits_labels(const at::Tensor& logits, const at::Tensor& labels) {
  MM_CHECK(logits.dim() >= 2 && labels.dim() == logits.dim() - 1 &&
               labels.sizes() == logits.sizes().slice(0, logits.dim() - 1),
           "cross_entropy: logits ", logits.sizes(), " and labels ", labels.sizes(), " do not line up");
  at::Tensor x = logits.reshape({-1, logits.size(-1)});
  if (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) x = x.to(at::kFloat);
  return {x, labels.reshape({-1}).to(at::kLong)};
}

// Flat sample index of every token: row * (segments per row) + segment, or the row.
at::Tensor sample_index(const at::Tensor& labels, const at::Tensor& segment_ids, int64_t* num_samples) {
  const int64_t B = labels.size(0), S = labels.numel() / std::max<int64_t>(1, B);
  at::Tensor row = at::arange(B, at::TensorOptions().dtype(at::kLong).device(labels.device())).unsqueeze(1).expand({B, S});
  if (!segment_ids.defined()) {
    *num_samples = B;
    return row.reshape({-1});
  }
  MM_CHECK(segment_ids.sizes() == labels.sizes(), "cross_entropy: segment_ids ", segment_ids.sizes(), " and labels ",
           labels.sizes(), " do not line up");
  const int64_t per_row = segment_ids.numel() > 0 ? segment_ids.max().item<int64_t>() + 1 : 1;
  *num_samples = B * std::max<int64_t>(1, per_row);
  return (row * std::max<int64_t>(1, per_row) + segment_ids.to(at::kLong).clamp_min(0)).reshape({-1});
}

}  // namespace

CrossEntropySum lm_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  auto [x, y] = flat_logits_labels(logits, labels);
  at::Tensor sum = at::cross_entropy_loss(x, y, {}, at::Reduction::Sum, kIgnoreIndex);
  at::Tensor count = (y != kIgnoreIndex).sum();
  return {sum, count};
}

CrossEntropySum lm_cross_entropy_per_sample_sum(const at::Tensor& logits, const at::Tensor& labels,
                                                const at::Tensor& segment_ids) {
  auto [x, y] = flat_logits_labels(logits, labels);
  at::Tensor per_token = at::cross_entropy_loss(x, y, {}, at::Reduction::None, kIgnoreIndex);  // 0 where ignored
  return per_sample_sum(per_token, labels, segment_ids);
}

CrossEntropySum per_sample_sum(const at::Tensor& token_losses, const at::Tensor& labels, const at::Tensor& segment_ids) {
  at::Tensor per_token = token_losses.reshape({-1});
  at::Tensor y = labels.reshape({-1});
  int64_t n = 0;
  at::Tensor sid = sample_index(labels, segment_ids, &n);
  at::Tensor tokens = at::zeros({n}, per_token.options()).index_add(0, sid, (y != kIgnoreIndex).to(per_token.scalar_type()));
  at::Tensor sums = at::zeros({n}, per_token.options()).index_add(0, sid, per_token);
  at::Tensor scored = tokens > 0;
  return {(sums / tokens.clamp_min(1)).masked_select(scored).sum(), scored.sum()};
}

int64_t scored_samples(const at::Tensor& labels, const at::Tensor& segment_ids) {
  int64_t n = 0;
  at::Tensor sid = sample_index(labels, segment_ids, &n);
  at::Tensor tokens = at::zeros({n}, at::TensorOptions().dtype(at::kLong).device(labels.device()))
                          .index_add(0, sid, (labels.reshape({-1}) != kIgnoreIndex).to(at::kLong));
  return (tokens > 0).sum().item<int64_t>();
}

namespace {

// One chunk's fp32 logits [n, V] of hidden rows [s, s + n).
at::Tensor chunk_logits(const at::Tensor& h, const at::Tensor& w, int64_t s, int64_t n) {
  return at::matmul(h.narrow(0, s, n), w.t()).to(at::kFloat);
}

struct ChunkedLinearCrossEntropy : torch::autograd::Function<ChunkedLinearCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, int64_t chunk) {
    const int64_t H = hidden.size(-1), N = hidden.numel() / std::max<int64_t>(1, H);
    const at::Tensor h = hidden.reshape({N, H}), y = labels.reshape({N}).to(at::kLong);
    at::Tensor out = at::zeros({N}, hidden.options().dtype(at::kFloat));
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor logits = chunk_logits(h, weight, s, n);
      const at::Tensor yc = y.narrow(0, s, n);
      const at::Tensor target = logits.gather(1, yc.clamp_min(0).unsqueeze(1)).squeeze(1);
      out.narrow(0, s, n).copy_((at::logsumexp(logits, {1}) - target) * yc.ne(kIgnoreIndex).to(at::kFloat));
    }
    ctx->save_for_backward({hidden, weight, labels});
    ctx->saved_data["chunk"] = chunk;
    return out.view(labels.sizes());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t H = hidden.size(-1), N = hidden.numel() / std::max<int64_t>(1, H);
    const at::Tensor h = hidden.reshape({N, H}), y = saved[2].reshape({N}).to(at::kLong);
    const at::Tensor g = grads[0].reshape({N}).to(at::kFloat);
    at::Tensor grad_h = at::empty({N, H}, hidden.options());
    at::Tensor grad_w = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor yc = y.narrow(0, s, n);
      // d loss / d logits = (softmax - onehot(label)) x the token's upstream gradient (0 if ignored).
      at::Tensor d = at::softmax(chunk_logits(h, weight, s, n), 1);
      d.scatter_add_(1, yc.clamp_min(0).unsqueeze(1), at::full({n, 1}, -1.0, d.options()));
      d.mul_((g.narrow(0, s, n) * yc.ne(kIgnoreIndex).to(at::kFloat)).unsqueeze(1));
      const at::Tensor dh = d.to(weight.scalar_type());
      grad_h.narrow(0, s, n).copy_(at::matmul(dh, weight));
      grad_w.add_(at::matmul(dh.t(), h.narrow(0, s, n)).to(at::kFloat));
    }
    return {grad_h.view(hidden.sizes()), grad_w.to(weight.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                        int64_t chunk) {
  MM_CHECK(chunk > 0, "chunked cross-entropy: chunk must be > 0 (got ", chunk, ")");
  MM_CHECK(hidden.dim() >= 2 && weight.dim() == 2 && weight.size(1) == hidden.size(-1) &&
               labels.numel() * hidden.size(-1) == hidden.numel(),
           "chunked cross-entropy: hidden ", hidden.sizes(), ", head weight ", weight.sizes(), " and labels ",
           labels.sizes(), " do not line up");
  return ChunkedLinearCrossEntropy::apply(hidden, weight, labels, chunk);
}

at::Tensor lm_cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  auto [sum, count] = lm_cross_entropy_sum(logits, labels);
  return sum / count.clamp_min(1).to(sum.scalar_type());
}

}  // namespace mm::models
