// Reading the component objects of a tokenizer.json: their "type", optional flags and required
// members, with errors that name the file, the stage and the key.
#pragma once

#include <cstdint>
#include <limits>
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

// An integer field as T: a JSON integer inside T's range, else an Error naming file and key.
// (nlohmann's get<T>() casts a float such as 1e26 to T: undefined behaviour, found by
// fuzz_tokenizer_json under UBSan.)
template <class T>
T integer(const json& v, const std::string& source, const char* key) {
  const bool fits = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                        : v.is_number_integer() && v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                              (v.get<int64_t>() < 0 || static_cast<uint64_t>(v.get<int64_t>()) <=
                                                           static_cast<uint64_t>(std::numeric_limits<T>::max()));
  if (!fits) throw Error(cat(source, ": \"", key, "\" must be an integer in range (got ", v.dump().substr(0, 40), ")"));
  return v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>()) : static_cast<T>(v.get<int64_t>());
}

// The same for an optional member: `dflt` when it is absent or null.
template <class T>
T integer_or(const json& j, const char* key, T dflt, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return integer<T>(*it, source, key);
}

}  // namespace mm::data::json_fields
