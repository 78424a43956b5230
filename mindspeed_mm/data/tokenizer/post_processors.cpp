// Post-processors (tokenizers/src/processors/*.rs) for single sequences: the special tokens
// around the ids when add_special_tokens is set.
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/components.h"
#include "mindspeed_mm/data/tokenizer/json_fields.h"

namespace mm::data {

using nlohmann::json;
using namespace json_fields;

namespace {

class NoOpPostProcessor : public PostProcessor {  // ByteLevel: only trims offsets, which we do not track
 public:
  void process(std::vector<int64_t>&, bool) const override {}
  size_t added_tokens() const override { return 0; }
};

// TemplateProcessing's "single" template, and BertProcessing / RobertaProcessing, which for
// one sequence are the template [cls] $A [sep].
class TemplatePostProcessor : public PostProcessor {
 public:
  struct Piece {
    bool is_sequence;
    std::vector<int64_t> ids;  // for a special token
  };
  std::vector<Piece> single;
  void process(std::vector<int64_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int64_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& p : single) {
      if (p.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), p.ids.begin(), p.ids.end());
    }
    ids.swap(out);
  }
  size_t added_tokens() const override {
    size_t n = 0;
    for (const auto& p : single) n += p.is_sequence ? 0 : p.ids.size();
    return n;
  }
};

class PostProcessorSequence : public PostProcessor {
 public:
  std::vector<std::unique_ptr<PostProcessor>> stages;
  void process(std::vector<int64_t>& ids, bool add_special_tokens) const override {
    for (const auto& s : stages) s->process(ids, add_special_tokens);
  }
  size_t added_tokens() const override {
    size_t n = 0;
    for (const auto& s : stages) n += s->added_tokens();
    return n;
  }
};

// A ["[CLS]", 101] pair of BertProcessing / RobertaProcessing.
int64_t token_pair_id(const json& j, const char* key, const std::string& source, const std::string& type) {
  const json& v = member(j, key, source, "post_processor");
  if (!v.is_array() || v.size() != 2 || !v[0].is_string() || !v[1].is_number_integer())
    throw Error(cat(source, ": ", type, " \"", key, "\" must be [token, id] (got ", v.dump(), ")"));
  return v[1].get<int64_t>();
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& source) {
  if (j.is_null()) return nullptr;
  std::string type = type_of(j, source, "post_processor");
  if (type == "ByteLevel") return std::make_unique<NoOpPostProcessor>();
  if (type == "TemplateProcessing") {
    auto p = std::make_unique<TemplatePostProcessor>();
    const json& specials = member(j, "special_tokens", source, "post_processor");
    for (const auto& piece : member(j, "single", source, "post_processor")) {
      if (piece.contains("Sequence")) {
        p->single.push_back({true, {}});
      } else if (piece.contains("SpecialToken")) {
        std::string name = piece["SpecialToken"].at("id").get<std::string>();
        MM_CHECK(specials.contains(name), source, ": TemplateProcessing uses special token '", name,
                 "' missing from its special_tokens");
        p->single.push_back({false, specials[name].at("ids").get<std::vector<int64_t>>()});
      } else {
        throw Error(cat(source, ": TemplateProcessing piece ", piece.dump(), " is neither Sequence nor SpecialToken"));
      }
    }
    return p;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto p = std::make_unique<TemplatePostProcessor>();
    p->single = {{false, {token_pair_id(j, "cls", source, type)}},
                 {true, {}},
                 {false, {token_pair_id(j, "sep", source, type)}}};
    return p;
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<PostProcessorSequence>();
    for (const auto& s : member(j, "processors", source, "post_processor"))
      seq->stages.push_back(make_post_processor(s, source));
    return seq;
  }
  unsupported(source, "post_processor", j);
}

}  // namespace mm::data
