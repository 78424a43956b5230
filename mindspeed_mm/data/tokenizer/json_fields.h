// Reading the component objects of a tokenizer.json: their "type", optional flags and required
// members, with errors that name the file, the stage and the key.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"

namespace mm::data::json_fields {

using nlohmann::json;

[[noreturn]] inline void unsupported(const std::string& source, const char* stage, const json& j) {
  std::string type = j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                                  : j.dump();
  throw Error(cat(source, ": ", stage, " type '", type, "' is not supported"));
}

inline std::string type_of(const json& j, const std::string& source, const char* stage) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw Error(cat(source, ": ", stage, " must be an object with a string \"type\" (got ", j.dump().substr(0, 80), ")"));
  return j["type"].get<std::string>();
}

inline bool flag(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return it->get<bool>();
}

inline const json& member(const json& j, const char* key, const std::string& source, const char* stage) {
  auto it = j.find(key);
  if (it == j.end()) throw Error(cat(source, ": ", stage, " '", j.value("type", ""), "' has no \"", key, "\""));
  return *it;
}

inline std::string string_or(const json& j, const char* key, const std::string& dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return it->get<std::string>();
}

}  // namespace mm::data::json_fields
