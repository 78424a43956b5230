#include "mindspeed_mm/data/batch.h"

#include <algorithm>

#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/errors.h"

namespace mm::data {

const TensorMap::Field* TensorMap::find(std::string_view name) const {
  for (const auto& f : fields_)
    if (f.name == name) return &f;
  return nullptr;
}

const at::Tensor& TensorMap::operator[](std::string_view name) const {
  static const at::Tensor kUndefined;
  const Field* f = find(name);
  return f ? f->tensor : kUndefined;
}

void TensorMap::set(std::string_view name, at::Tensor t, bool host) {
  auto it = std::find_if(fields_.begin(), fields_.end(), [&](const Field& f) { return f.name == name; });
  if (!t.defined()) {
    if (it != fields_.end()) fields_.erase(it);
    return;
  }
  if (it != fields_.end()) {
    it->tensor = std::move(t);
    it->host = host;
  } else {
    fields_.push_back({std::string(name), std::move(t), host});
  }
}

const at::Tensor& TensorMap::require_tensor(std::string_view name) const {
  const Field* f = find(name);
  MM_CHECK(f && f->tensor.defined(), "no tensor '", std::string(name), "' (have: ", cat(names().size()), " fields)");
  return f->tensor;
}

std::vector<std::string> TensorMap::names() const {
  std::vector<std::string> out;
  for (const auto& f : fields_) out.push_back(f.name);
  return out;
}

const at::Tensor& Batch::require(std::string_view name) const {
  const at::Tensor& t = (*this)[name];
  if (!t.defined()) {
    std::string have;
    for (const auto& n : names()) have += (have.empty() ? "" : ", ") + n;
    throw Error(cat("batch", sources.empty() ? "" : " of " + sources.front(), " has no field '", name, "' (it has: ",
                    have.empty() ? "none" : have, ")"));
  }
  return t;
}

Batch batch_to_device(const Batch& b, const at::Device& device) {
  if (device.is_cpu()) return b;
  Batch d;
  d.sources = b.sources;
  d.captions = b.captions;
  d.num_samples = b.num_samples;
  for (const auto& f : b.fields()) d.set(f.name, f.host ? f.tensor : to_device(f.tensor, device), f.host);
  return d;
}

std::string missing_fields(const std::vector<std::string>& needed, const std::vector<std::string>& have) {
  std::string out;
  for (const auto& n : needed)
    if (std::find(have.begin(), have.end(), n) == have.end()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace mm::data
