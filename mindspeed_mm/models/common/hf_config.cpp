#include "mindspeed_mm/models/common/hf_config.h"

#include <algorithm>
#include <cmath>

#include "mindspeed_mm/core/errors.h"

namespace mm::models {

using nlohmann::json;

HFConfigReader::HFConfigReader(const json& j, std::string source, std::string prefix, std::string model)
    : j_(j), source_(std::move(source)), prefix_(std::move(prefix)), model_(std::move(model)) {
  if (!j_.is_object())
    throw ConfigError(cat("config: ", prefix_.empty() ? "a " + model_ + " model config" : prefix_.substr(0, prefix_.size() - 1),
                          " must be an object in ", source_));
}

bool HFConfigReader::has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

void HFConfigReader::fail(const std::string& key, const std::string& what) const {
  throw ConfigError(cat("config: ", prefix_, key, " ", what, " in ", source_));
}

void HFConfigReader::check(const char* key, double v, const std::string& shown, const config::Check& c) const {
  if (!c.number) return;
  const std::string why = c.number(v);
  if (!why.empty()) fail(key, cat(why, " (got ", shown, ")"));
}

void HFConfigReader::operator()(const char* key, int64_t& v, const config::Check& c) {
  if (!has(key)) return;
  const json& x = j_.at(key);
  if (!x.is_number_integer()) fail(key, cat("must be an integer (got ", x.dump(), ")"));
  v = x.get<int64_t>();
  check(key, static_cast<double>(v), std::to_string(v), c);
}

void HFConfigReader::operator()(const char* key, double& v, const config::Check& c) {
  if (!has(key)) return;
  const json& x = j_.at(key);
  if (!x.is_number()) fail(key, cat("must be a number (got ", x.dump(), ")"));
  v = x.get<double>();
  check(key, v, x.dump(), c);
}

void HFConfigReader::operator()(const char* key, bool& v, const config::Check& c) {
  if (!has(key)) return;
  const json& x = j_.at(key);
  if (!x.is_boolean()) fail(key, cat("must be true or false (got ", x.dump(), ")"));
  v = x.get<bool>();
}

void HFConfigReader::operator()(const char* key, std::string& v, const config::Check& c) {
  if (!has(key)) return;
  const json& x = j_.at(key);
  if (!x.is_string()) fail(key, cat("must be a string (got ", x.dump(), ")"));
  v = x.get<std::string>();
  if (!c.choices.empty() && std::find(c.choices.begin(), c.choices.end(), v) == c.choices.end()) {
    std::string list;
    for (const auto& s : c.choices) list += (list.empty() ? "\"" : ", \"") + s + "\"";
    fail(key, cat("must be ", list, " (got \"", v, "\")"));
  }
}

void HFConfigReader::operator()(const char* key, c10::optional<int64_t>& v, const config::Check& c) {
  if (!has(key)) return;
  int64_t x = 0;
  (*this)(key, x, c);
  v = x;
}

void HFConfigReader::operator()(const char* key, std::vector<int64_t>& v, const config::Check& c) {
  if (!has(key)) return;
  const json& x = j_.at(key);
  if (!x.is_array()) fail(key, cat("must be a list of integers (got ", x.dump(), ")"));
  std::vector<int64_t> out;
  for (const auto& e : x) {
    if (!e.is_number_integer()) fail(key, cat("must be a list of integers (got ", x.dump(), ")"));
    out.push_back(e.get<int64_t>());
    check(key, static_cast<double>(out.back()), std::to_string(out.back()), c);
  }
  v = std::move(out);
}

void HFConfigReader::refuse_unknown_keys(const std::set<std::string>& keys, const std::string& what) const {
  const std::vector<std::string> known(keys.begin(), keys.end());
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (keys.count(it.key())) continue;
    const std::string best = config::suggest(it.key(), known);
    throw ConfigError(cat("config: unknown ", what, " key '", prefix_, it.key(), "'",
                          best.empty() ? "" : cat(" (did you mean '", best, "'?)"), " in ", source_));
  }
}

void HFConfigWriter::integral_number(const char* key, double v, const config::Check&) {
  // transformers >= 5 validates types: a field declared int (Qwen2-VL's mlp_ratio) refuses 4.0.
  out_[key] = v == std::floor(v) ? json(static_cast<int64_t>(v)) : json(v);
}

}  // namespace mm::models
