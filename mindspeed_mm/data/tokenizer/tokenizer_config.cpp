#include "mindspeed_mm/data/tokenizer/tokenizer_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/core/file_io.h"

namespace mm::data {
namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  const std::string& path;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(cat(path, ": ", key, " ", what));
  }
  // A token: a string, an AddedToken object with "content", or null.
  std::optional<std::string> token(const json& v, const std::string& key) const {
    if (v.is_null()) return std::nullopt;
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    fail(key, cat("must be a string, an object with \"content\", or null (got ", v.dump(), ")"));
  }
  std::optional<std::string> token(const char* key) const {
    return j.contains(key) ? token(j[key], key) : std::nullopt;
  }
  bool flag(const char* key, bool dflt) const {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    if (!j[key].is_boolean()) fail(key, cat("must be true or false (got ", j[key].dump(), ")"));
    return j[key].get<bool>();
  }
  std::string text(const char* key) const {
    if (!j.contains(key) || j[key].is_null()) return "";
    if (!j[key].is_string()) fail(key, cat("must be a string (got ", j[key].type_name(), ")"));
    return j[key].get<std::string>();
  }
};

}  // namespace

TokenizerConfig load_tokenizer_config(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  fs::path p(dir_or_file);
  if (fs::is_directory(p) && p.filename() != "tokenizer_config.json") p /= "tokenizer_config.json";
  const std::string path = p.string();
  if (const std::string why = file_problem(path); !why.empty()) throw Error(cat(path, ": ", why));
  std::ifstream f(path);
  if (!f) throw Error(cat(path, ": cannot read tokenizer_config.json"));
  std::stringstream ss;
  ss << f.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    throw Error(cat(path, ": not valid JSON (", json_error_text(e.what()), ")"));
  }
  if (!j.is_object()) throw Error(cat(path, ": must hold a JSON object"));

  Reader r{j, path};
  TokenizerConfig c;
  c.bos_token = r.token("bos_token");
  c.eos_token = r.token("eos_token");
  c.pad_token = r.token("pad_token");
  c.unk_token = r.token("unk_token");
  if (j.contains("additional_special_tokens") && !j["additional_special_tokens"].is_null()) {
    const json& a = j["additional_special_tokens"];
    if (!a.is_array()) r.fail("additional_special_tokens", "must be a list");
    for (const json& t : a)
      if (auto s = r.token(t, "additional_special_tokens")) c.additional_special_tokens.push_back(*s);
  }
  c.add_bos_token = r.flag("add_bos_token", false);
  c.add_eos_token = r.flag("add_eos_token", false);
  c.has_add_bos_token = j.contains("add_bos_token") && !j["add_bos_token"].is_null();
  c.has_add_eos_token = j.contains("add_eos_token") && !j["add_eos_token"].is_null();
  if (j.contains("do_lower_case") && !j["do_lower_case"].is_null()) c.do_lower_case = r.flag("do_lower_case", true);
  if (j.contains("model_max_length") && !j["model_max_length"].is_null()) {
    const json& m = j["model_max_length"];
    if (!m.is_number() || m.get<double>() <= 0) r.fail("model_max_length", cat("must be a positive number (got ", m.dump(), ")"));
    double v = m.get<double>();
    c.model_max_length = v >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(std::llround(v));
  }
  c.chat_template = r.text("chat_template");
  c.tokenizer_class = r.text("tokenizer_class");
  return c;
}

}  // namespace mm::data
