// PCRE2 behind UnicodeRegex: JIT-compiled when the JIT is available, with a per-thread JIT
// stack large enough for 1 MB runs of one character class.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "mindspeed_mm/data/tokenizer/unicode_regex.h"

#include <pcre2.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

std::string UnicodeRegex::translate(const std::string& p) {
  static const char* kSpaceSet = "\\t-\\r\\x{85}\\p{Z}";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kSpaceSet) : std::string("[") + kSpaceSet + "]";
      } else if (n == 'S' && !in_class) {
        out += std::string("[^") + kSpaceSet + "]";
      } else if (n == 'h') {  // Ruby syntax: a hex digit (PCRE2: horizontal space)
        out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
      } else if (n == 'H' && !in_class) {
        out += "[^0-9a-fA-F]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

UnicodeRegex::UnicodeRegex(const std::string& onig_pattern) : pattern_(onig_pattern) {
  std::string translated = translate(onig_pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw Error(cat("tokenizer: regex '", onig_pattern, "' does not compile: ", reinterpret_cast<char*>(msg),
                    " at offset ", err_off));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when it fails
  code_ = std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
}

namespace {
// One match context and JIT stack per thread: encode() is const and may run on many threads.
struct ThreadMatchContext {
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchContext() {
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~ThreadMatchContext() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
  }
};
}  // namespace

std::vector<std::pair<size_t, size_t>> UnicodeRegex::find_all(std::string_view text) const {
  thread_local ThreadMatchContext tmc;
  auto* code = static_cast<pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  std::vector<std::pair<size_t, size_t>> out;
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last_end = 0;
  bool have_last_match = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK, md.get(), tmc.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      throw Error(cat("tokenizer: regex '", pattern_, "' failed on a ", text.size(),
                      "-byte input: ", reinterpret_cast<char*>(msg)));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t s = ov[0], e = ov[1];
    if (s == e && have_last_match && last_match_end == last_end) {
      last_end += unicode::char_len(text, last_end);
      continue;
    }
    last_end = e;
    have_last_match = true;
    last_match_end = e;
    out.emplace_back(s, e);
  }
  return out;
}

}  // namespace mm::data
