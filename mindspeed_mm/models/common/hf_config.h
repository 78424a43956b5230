// Hugging Face config.json fields, read and written from one list. A model config struct lists
// its fields once, `template <class IO> void io(IO& io)` with `io("key", field, check)` (the
// checks of config/config_io.h: gt, ge, in_range, one_of), and the same list drives
//   HFConfigReader  a config.json object (or a nested one such as vision_config) into the struct:
//                   types and ranges checked, a missing field keeping the struct's default, every
//                   error one line naming the key and the file ("config: vision_config.depth must
//                   be > 0 (got 0) in /models/qwen2vl/config.json"), and in strict mode (a config
//                   written in our YAML) unknown keys refused with a "did you mean";
//   HFConfigWriter  the struct back into a config.json that transformers loads.
#pragma once

#include <c10/util/Optional.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "mindspeed_mm/config/config_io.h"

namespace mm::models {

// A string member of a config.json: `dflt` when absent or null, the string when it is one, and
// otherwise the value's JSON text in parentheses, so a comparison with an expected name fails and
// the message shows what was there (nlohmann's value() throws its own type_error instead; found by
// fuzz_model_config).
inline std::string hf_string(const nlohmann::json& j, const char* key, const std::string& dflt) {
  if (!j.is_object()) return dflt;
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (it->is_string()) return it->get<std::string>();
  return "(" + it->dump().substr(0, 40) + ")";
}

// The keys a struct's io() list names (and the keys it ignores), to refuse unknown keys before
// any field is read.
class HFConfigKeys {
 public:
  template <class T>
  void operator()(const char* key, const T&, const config::Check& = config::any()) {
    keys.insert(key);
  }
  template <class T>
  void required(const char* key, const T&, const config::Check& = config::any()) {
    keys.insert(key);
  }
  void integral_number(const char* key, double, const config::Check& = config::any()) { keys.insert(key); }
  void ignore(const std::vector<std::string>& k) { keys.insert(k.begin(), k.end()); }
  std::set<std::string> keys;
};

class HFConfigReader {
 public:
  // prefix: the nested object's name in messages ("vision_config."); model: the model family's
  // name for "is required for a qwen2 model".
  HFConfigReader(const nlohmann::json& j, std::string source, std::string prefix = "", std::string model = "");

  void operator()(const char* key, int64_t& v, const config::Check& c = config::any());
  void operator()(const char* key, double& v, const config::Check& c = config::any());
  void operator()(const char* key, bool& v, const config::Check& c = config::any());
  void operator()(const char* key, std::string& v, const config::Check& c = config::any());
  void operator()(const char* key, c10::optional<int64_t>& v, const config::Check& c = config::any());
  void operator()(const char* key, std::vector<int64_t>& v, const config::Check& c = config::any());
  // A number that transformers writes as an integer when it is one (Qwen2-VL's mlp_ratio).
  void integral_number(const char* key, double& v, const config::Check& c = config::any()) { (*this)(key, v, c); }
  // The same field, required: a missing key is an error.
  template <class T>
  void required(const char* key, T& v, const config::Check& c = config::any()) {
    if (!has(key)) fail(key, model_.empty() ? "is required" : "is required for a " + model_ + " model");
    (*this)(key, v, c);
  }
  // Keys this config accepts and ignores (written by transformers, meaningless here).
  void ignore(const std::vector<std::string>&) {}

  bool has(const char* key) const;
  const nlohmann::json& at(const char* key) const { return j_.at(key); }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  // Strict mode (our YAML): an error naming the first key of the object not in `known`, with a
  // "did you mean" ("config: unknown qwen2 key 'hidden_szie' (did you mean 'hidden_size'?) in
  // tiny.yaml").
  void refuse_unknown_keys(const std::set<std::string>& known, const std::string& what) const;

 private:
  void check(const char* key, double v, const std::string& shown, const config::Check& c) const;
  const nlohmann::json& j_;
  std::string source_, prefix_, model_;
};

class HFConfigWriter {
 public:
  explicit HFConfigWriter(nlohmann::json& out) : out_(out) {}
  template <class T>
  void operator()(const char* key, const T& v, const config::Check& = config::any()) {
    out_[key] = v;
  }
  void operator()(const char* key, const c10::optional<int64_t>& v, const config::Check& = config::any()) {
    if (v) out_[key] = *v;
  }
  void integral_number(const char* key, double v, const config::Check& = config::any());
  template <class T>
  void required(const char* key, const T& v, const config::Check& c = config::any()) {
    (*this)(key, v, c);
  }
  void ignore(const std::vector<std::string>&) {}

 private:
  nlohmann::json& out_;
};

// Reads the struct's io() list from j (see HFConfigReader), then refuses unknown keys when strict.
// extra_keys: keys the caller reads itself. model: the family's name in messages.
template <class T>
void read_hf_fields(T& c, const nlohmann::json& j, const std::string& source, bool strict, const std::string& prefix,
                    const std::string& model, const std::vector<std::string>& extra_keys = {}) {
  HFConfigReader r(j, source, prefix, model);
  if (strict) {
    HFConfigKeys k;
    c.io(k);
    k.ignore(extra_keys);
    r.refuse_unknown_keys(k.keys, model);
  }
  c.io(r);
}

// The struct's io() list as a JSON object.
template <class T>
nlohmann::json write_hf_fields(const T& c) {
  nlohmann::json out = nlohmann::json::object();
  HFConfigWriter w(out);
  const_cast<T&>(c).io(w);  // io() only reads the fields through a writer
  return out;
}

}  // namespace mm::models
