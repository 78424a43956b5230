// mllm JSON/JSONL records, mixtures of several datasets, and the LLaVA converter.
#include "mindspeed_mm/data/mllm/mllm_dataset.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/data/sampler.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace mm::data {

int64_t count_placeholder(const std::string& text, const std::string& placeholder) {
  int64_t n = 0;
  for (size_t pos = text.find(placeholder); pos != std::string::npos; pos = text.find(placeholder, pos + placeholder.size()))
    ++n;
  return n;
}

// Parses one record; returns the reason it is unusable, or "" with `out` filled.
std::string parse_mllm_record(const json& j, const MllmAttr& a, const fs::path& root, MllmRecord& out) {
  if (!j.is_object()) return "not a JSON object";
  if (!j.contains(a.messages)) return cat("no '", a.messages, "' field");
  const json& msgs = j.at(a.messages);
  if (!msgs.is_array() || msgs.empty()) return cat("'", a.messages, "' is not a non-empty list");
  if (j.contains(a.system) && !j.at(a.system).is_null()) {
    if (!j.at(a.system).is_string()) return cat("'", a.system, "' is not a string");
    const std::string sys = j.at(a.system).get<std::string>();
    if (!sys.empty()) out.messages.push_back({"system", sys});
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    if (!m.is_object() || !m.contains(a.role_tag) || !m.contains(a.content_tag) || !m.at(a.role_tag).is_string() ||
        !m.at(a.content_tag).is_string())
      return cat(a.messages, "[", i, "] needs string '", a.role_tag, "' and '", a.content_tag, "' fields");
    const std::string role = m.at(a.role_tag).get<std::string>();
    std::string norm;
    if (role == a.user_tag) norm = "user";
    else if (role == a.assistant_tag) norm = "assistant";
    else if (role == a.system_tag) norm = "system";
    else return cat(a.messages, "[", i, "] has role '", role, "' (expected '", a.user_tag, "', '", a.assistant_tag, "' or '",
                    a.system_tag, "')");
    out.messages.push_back({norm, m.at(a.content_tag).get<std::string>()});
  }
  auto media = [&](const std::string& key, std::vector<std::string>& paths) -> std::string {
    if (!j.contains(key) || j.at(key).is_null()) return "";
    const json& v = j.at(key);
    if (v.is_string()) {  // a single path, as some LLaVA-derived files write it
      paths.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (auto& p : v) {
        if (!p.is_string()) return cat("'", key, "' holds a non-string entry");
        paths.push_back(p.get<std::string>());
      }
    } else {
      return cat("'", key, "' is not a list of paths");
    }
    for (auto& p : paths) {
      if (p.empty()) return cat("'", key, "' holds an empty path");
      if (fs::path(p).is_relative()) p = (root / p).lexically_normal().string();
    }
    return "";
  };
  auto strings = [&](const char* key, std::vector<std::string>& into) -> std::string {
    if (!j.contains(key) || j.at(key).is_null()) return "";
    if (!j.at(key).is_array()) return cat("'", key, "' is not a list of strings");
    for (auto& v : j.at(key)) {
      if (!v.is_string()) return cat("'", key, "' holds a non-string entry");
      into.push_back(v.get<std::string>());
    }
    return "";
  };
  if (auto why = strings("answers", out.answers); !why.empty()) return why;
  if (auto why = strings("options", out.options); !why.empty()) return why;
  if (auto why = media(a.images, out.images); !why.empty()) return why;
  if (auto why = media(a.videos, out.videos); !why.empty()) return why;
  int64_t n_img = 0, n_vid = 0;
  for (auto& m : out.messages) {
    const int64_t i = count_placeholder(m.content, "<image>"), v = count_placeholder(m.content, "<video>");
    // The chat templates expand placeholders in prompts only; an answer cannot hold an image.
    if (m.role == "assistant" && i + v > 0) return "an <image>/<video> placeholder in an assistant turn";
    n_img += i;
    n_vid += v;
  }
  if (n_img != static_cast<int64_t>(out.images.size()))
    return cat(n_img, " <image> placeholder(s) but ", out.images.size(), " image(s)");
  if (n_vid != static_cast<int64_t>(out.videos.size()))
    return cat(n_vid, " <video> placeholder(s) but ", out.videos.size(), " video(s)");
  return "";
}

std::string record_key(const MllmRecord& r, const std::string& media_root) {
  const fs::path root(media_root);
  std::string k;
  for (auto& m : r.messages) k += m.role + '\x1f' + m.content + '\x1e';
  for (const auto* paths : {&r.images, &r.videos}) {
    for (auto& p : *paths) {
      const fs::path rel = fs::path(p).lexically_relative(root);
      k += (rel.empty() ? fs::path(p) : rel).generic_string() + '\x1d';
    }
    k += '\x1c';
  }
  return k;
}

MllmFile read_mllm_file(const std::string& path, const MllmAttr& attr, const std::string& media_root) {
  auto bytes = read_file_bytes(path);
  MM_CHECK(bytes, "data: cannot read '", path, "'");
  const fs::path root = media_root.empty() ? fs::path(path).parent_path() : fs::path(media_root);
  const std::string name = fs::path(path).filename().string();
  MllmFile out;
  out.media_root = root.string();
  auto add = [&](const json& j, const std::string& where) {
    MllmRecord r;
    std::string why = parse_mllm_record(j, attr, root, r);
    if (!why.empty()) {
      out.bad.push_back({where, why});
      return;
    }
    r.source = where;
    out.records.push_back(std::move(r));
  };
  const std::string& text = *bytes;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    json arr = text.find('\0') == std::string::npos ? json::parse(text, nullptr, /*allow_exceptions=*/false)
                                                     : json(json::value_t::discarded);
    MM_CHECK(!arr.is_discarded() && arr.is_array(), "data: '", path, "' starts with '[' but is not a valid JSON array");
    for (size_t i = 0; i < arr.size(); ++i) add(arr[i], cat(name, "[", i, "]"));
    return out;
  }
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line_no;
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    // nlohmann's parser stops at a NUL byte as at the end of the text: a line holding one is not
    // JSON, whatever comes before it (the record index reads it the same way).
    json j = line.find('\0') == std::string_view::npos ? json::parse(line, nullptr, /*allow_exceptions=*/false)
                                                        : json(json::value_t::discarded);
    if (j.is_discarded()) {
      out.bad.push_back({cat(name, ":", line_no), "not valid JSON"});
      continue;
    }
    add(j, cat(name, ":", line_no));
  }
  return out;
}

std::vector<MixEntry> build_mixture(const std::vector<int64_t>& sizes, const std::vector<double>& weights,
                                    uint64_t seed) {
  MM_CHECK(weights.empty() || weights.size() == sizes.size(), "data: ", weights.size(), " weights for ", sizes.size(),
           " datasets (data.weights needs one per entry of data.paths)");
  for (size_t i = 0; i < weights.size(); ++i)
    MM_CHECK(weights[i] >= 0 && std::isfinite(weights[i]), "data: weight ", i, " must be >= 0 (got ", weights[i], ")");
  std::vector<MixEntry> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    const double w = weights.empty() ? 1.0 : weights[i];
    const int64_t n = std::llround(w * static_cast<double>(sizes[i]));
    for (int64_t rep = 0; rep < n / sizes[i]; ++rep)
      for (int64_t k = 0; k < sizes[i]; ++k) out.push_back({static_cast<int32_t>(i), k});
    const int64_t rest = n % sizes[i];
    if (rest > 0) {
      std::vector<int64_t> perm = epoch_permutation(sizes[i], splitmix64(seed ^ (0xD1B54A32D192ED03ULL * (i + 1))), 0);
      perm.resize(static_cast<size_t>(rest));
      std::sort(perm.begin(), perm.end());
      for (int64_t k : perm) out.push_back({static_cast<int32_t>(i), k});
    }
  }
  MM_CHECK(!out.empty(), "data: the datasets hold no samples (or every weight is 0)");
  return out;
}

ConvertSummary convert_llava(const std::string& in_path, const std::string& out_path) {
  auto bytes = read_file_bytes(in_path);
  MM_CHECK(bytes, "data: cannot read '", in_path, "'");
  json arr = json::parse(*bytes, nullptr, /*allow_exceptions=*/false);
  MM_CHECK(!arr.is_discarded() && arr.is_array(), "data: '", in_path,
           "' is not a LLaVA JSON file (expected one array of {\"image\", \"conversations\"} objects)");
  const std::string name = fs::path(in_path).filename().string();
  ConvertSummary s;
  std::string text;
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& e = arr[i];
    const std::string where = cat(name, "[", i, "]");
    auto bad = [&](const std::string& why) { s.bad.push_back({where, why}); };
    if (!e.is_object() || !e.contains("conversations") || !e.at("conversations").is_array()) {
      bad("no 'conversations' list");
      continue;
    }
    json messages = json::array();
    std::string why;
    for (auto& turn : e.at("conversations")) {
      if (!turn.is_object() || !turn.contains("from") || !turn.contains("value") || !turn.at("from").is_string() ||
          !turn.at("value").is_string()) {
        why = "a turn without string 'from' and 'value'";
        break;
      }
      const std::string from = turn.at("from").get<std::string>();
      std::string role = from == "human" ? "user" : from == "gpt" ? "assistant" : from == "system" ? "system" : "";
      if (role.empty()) {
        why = cat("a turn from '", from, "' (expected human, gpt or system)");
        break;
      }
      messages.push_back({{"role", role}, {"content", turn.at("value").get<std::string>()}});
    }
    if (!why.empty() || messages.empty()) {
      bad(why.empty() ? "an empty conversation" : why);
      continue;
    }
    json out = {{"messages", messages}};
    if (e.contains("id")) out["id"] = e.at("id");
    if (e.contains("image") && !e.at("image").is_null()) {
      if (!e.at("image").is_string()) {
        bad("'image' is not a string");
        continue;
      }
      out["images"] = json::array({e.at("image")});
      int64_t n = 0;
      for (auto& m : out["messages"]) n += count_placeholder(m["content"].get<std::string>(), "<image>");
      if (n == 0) {
        for (auto& m : out["messages"])
          if (m["role"] == "user") {
            m["content"] = "<image>\n" + m["content"].get<std::string>();
            break;
          }
      } else if (n != 1) {
        bad(cat(n, " <image> placeholders for one image"));
        continue;
      }
    }
    text += out.dump() + "\n";
    ++s.written;
  }
  const std::string tmp = out_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    MM_CHECK(f, "data: cannot write '", tmp, "'");
    f << text;
    f.close();
    MM_CHECK(f, "data: writing '", tmp, "' failed");
  }
  std::error_code ec;
  fs::rename(tmp, out_path, ec);
  MM_CHECK(!ec, "data: cannot rename '", tmp, "' to '", out_path, "': ", ec.message());
  return s;
}

}  // namespace mm::data
