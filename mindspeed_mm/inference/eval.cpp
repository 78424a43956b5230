// mm eval: prompts from mllm records, generation, answer scoring, teacher-forced loss.
#include "mindspeed_mm/inference/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/parallel_for.h"
#include "mindspeed_mm/data/mllm/mllm_collator.h"
#include "mindspeed_mm/models/common/cross_entropy.h"

namespace mm::inference {

namespace {

bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return s.substr(a, b - a);
}

std::string to_lower(std::string s) {
  for (char& c : s) c = lower(c);
  return s;
}

// The reference's letter: "B", "(B)", "B." -> 1; -1 when it is not a single letter.
int reference_letter(const std::string& ref) {
  std::string r;
  for (char c : trim(ref))
    if (c != '(' && c != ')' && c != '.') r += c;
  return r.size() == 1 && r[0] >= 'A' && r[0] <= 'Z' ? r[0] - 'A' : -1;
}

}  // namespace

models::MultimodalInputs sample_inputs(const data::EncodedSample& s) {
  models::MultimodalInputs in;
  in.input_ids = at::tensor(s.input_ids, at::kLong).unsqueeze(0);
  in.pixel_values = s.pixel_values;
  in.image_grid_thw = s.image_grid_thw;
  in.pixel_values_videos = s.pixel_values_videos;
  in.video_grid_thw = s.video_grid_thw;
  in.video_second_per_grid = s.video_second_per_grid;
  return in;
}

std::string normalize_answer(const std::string& answer) {
  const std::string s = to_lower(trim(answer));
  std::string cleaned;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool prev = i > 0 && is_alnum(s[i - 1]), next = i + 1 < s.size() && is_alnum(s[i + 1]);
    if (is_alnum(c) || static_cast<unsigned char>(c) >= 0x80) {
      cleaned += c;
    } else if (is_space(c)) {
      cleaned += ' ';
    } else if (c == '.' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
               std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      cleaned += c;  // 2.5 stays a number
    } else if (c != '\'' && prev && next) {
      cleaned += ' ';  // t-shirt/top -> t shirt top
    }
  }
  static const std::map<std::string, std::string> kNumbers = {
      {"none", "0"}, {"zero", "0"}, {"one", "1"}, {"two", "2"}, {"three", "3"}, {"four", "4"},
      {"five", "5"}, {"six", "6"}, {"seven", "7"}, {"eight", "8"}, {"nine", "9"}, {"ten", "10"}};
  std::istringstream words(cleaned);
  std::string w, out;
  while (words >> w) {
    if (w == "a" || w == "an" || w == "the") continue;
    auto it = kNumbers.find(w);
    if (!out.empty()) out += ' ';
    out += it == kNumbers.end() ? w : it->second;
  }
  return out;
}

int parse_choice(const std::string& answer, const std::vector<std::string>& options) {
  std::string r = trim(answer);
  auto strip = [](char c) { return c == ',' || c == '.' || c == '!' || c == '?' || c == ';' || c == ':' || c == '\''; };
  while (!r.empty() && strip(r.front())) r.erase(r.begin());
  while (!r.empty() && strip(r.back())) r.pop_back();
  r = " " + r + " ";
  const int n = options.empty() ? 10 : static_cast<int>(std::min<size_t>(options.size(), 26));
  int best = -1;
  size_t best_pos = 0;
  auto consider = [&](int choice, size_t pos) {
    if (pos == std::string::npos) return;
    if (best < 0 || pos > best_pos) {
      best = choice;
      best_pos = pos;
    }
  };
  for (int k = 0; k < n; ++k) consider(k, r.rfind(std::string("(") + static_cast<char>('A' + k) + ")"));
  if (best < 0) {
    for (int k = 0; k < n; ++k) {
      const char L = static_cast<char>('A' + k);
      for (const char* after : {" ", ".", ":", ")"}) consider(k, r.rfind(std::string(" ") + L + after));
    }
  }
  if (best < 0 && !options.empty()) {
    const std::string lr = to_lower(r);
    for (int k = 0; k < n; ++k) {
      const std::string o = to_lower(trim(options[k]));
      if (!o.empty()) consider(k, lr.rfind(o));
    }
  }
  return best;
}

double EvalReport::accuracy() const {
  const int64_t n = vqa + choice;
  return n ? static_cast<double>(vqa_normalized + choice_correct) / static_cast<double>(n) : NAN;
}

nlohmann::json EvalReport::to_json() const {
  using nlohmann::json;
  auto ratio = [](double a, int64_t b) { return b ? json(a / static_cast<double>(b)) : json(nullptr); };
  json j = {{"samples", samples}, {"errors", errors}, {"seconds", seconds},
            {"samples_per_second", seconds > 0 ? json(static_cast<double>(samples) / seconds) : json(nullptr)},
            {"generated_tokens", generated_tokens}};
  j["accuracy"] = vqa + choice ? json(accuracy()) : json(nullptr);
  j["vqa"] = {{"samples", vqa},
              {"exact_match", ratio(static_cast<double>(vqa_exact), vqa)},
              {"normalized_match", ratio(static_cast<double>(vqa_normalized), vqa)},
              {"vqa_accuracy", ratio(vqa_accuracy_sum, vqa)}};
  j["choice"] = {{"samples", choice},
                 {"accuracy", ratio(static_cast<double>(choice_correct), choice)},
                 {"unparsed", choice_unparsed}};
  j["loss"] = {{"tokens", loss_tokens},
               {"mean", ratio(loss_sum, loss_tokens)},
               {"perplexity", loss_tokens ? json(std::exp(loss_sum / static_cast<double>(loss_tokens))) : json(nullptr)}};
  json preds = json::array();
  for (const auto& p : predictions)
    preds.push_back({{"source", p.source}, {"task", p.task}, {"prediction", p.prediction}, {"reference", p.reference},
                     {"correct", p.correct}, {"loss", p.tokens ? json(p.loss / static_cast<double>(p.tokens)) : json(nullptr)}});
  j["predictions"] = preds;
  j["error_messages"] = error_messages;
  return j;
}

std::string EvalReport::table() const {
  std::string out;
  char line[160];
  auto row = [&](const char* metric, const std::string& value, int64_t n) {
    std::snprintf(line, sizeof line, "%-28s %12s %10lld\n", metric, value.c_str(), static_cast<long long>(n));
    out += line;
  };
  auto pct = [](double a, int64_t b) {
    char v[32];
    std::snprintf(v, sizeof v, "%.2f%%", 100.0 * a / static_cast<double>(b));
    return std::string(v);
  };
  std::snprintf(line, sizeof line, "%-28s %12s %10s\n", "metric", "value", "samples");
  out += line;
  if (vqa + choice) row("accuracy", pct(static_cast<double>(vqa_normalized + choice_correct), vqa + choice), vqa + choice);
  if (vqa) {
    row("vqa exact match", pct(static_cast<double>(vqa_exact), vqa), vqa);
    row("vqa normalized match", pct(static_cast<double>(vqa_normalized), vqa), vqa);
    row("vqa accuracy", pct(vqa_accuracy_sum, vqa), vqa);
  }
  if (choice) {
    row("choice accuracy", pct(static_cast<double>(choice_correct), choice), choice);
    row("choice unparsed", std::to_string(choice_unparsed), choice);
  }
  if (loss_tokens) {
    char v[32];
    std::snprintf(v, sizeof v, "%.4f", loss_sum / static_cast<double>(loss_tokens));
    std::snprintf(line, sizeof line, "%-28s %12s %10lld tokens\n", "loss / token", v, static_cast<long long>(loss_tokens));
    out += line;
    std::snprintf(v, sizeof v, "%.3f", std::exp(loss_sum / static_cast<double>(loss_tokens)));
    std::snprintf(line, sizeof line, "%-28s %12s\n", "perplexity", v);
    out += line;
  }
  if (errors) row("errors (not scored)", std::to_string(errors), errors);
  std::snprintf(line, sizeof line, "%lld samples in %.1f s (%.1f samples/s)\n", static_cast<long long>(samples), seconds,
                seconds > 0 ? static_cast<double>(samples) / seconds : 0.0);
  out += line;
  return out;
}

EvalReport evaluate(models::CausalLM& model, const data::SampleEncoder& encoder,
                    const std::vector<data::MllmRecord>& records, const EvalOptions& options,
                    const std::function<void(int64_t, int64_t)>& progress) {
  const size_t n = options.max_samples > 0 ? std::min<size_t>(records.size(), static_cast<size_t>(options.max_samples))
                                           : records.size();
  SamplingOptions sampling = options.sampling;
  sampling.validate();
  at::Device device = at::kCPU;  // the model's
  for (auto& p : model.parameters()) {
    device = p.device();
    break;
  }
  if (std::find(sampling.stop_token_ids.begin(), sampling.stop_token_ids.end(), encoder.eos_id()) ==
      sampling.stop_token_ids.end())
    sampling.stop_token_ids.push_back(encoder.eos_id());
  struct Result {
    EvalSample s;
    int64_t generated = 0;
    double vqa_score = 0;
    bool exact = false, unparsed = false;
    std::string error;
  };
  std::vector<Result> results(n);
  std::mutex progress_mutex;
  int64_t done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  parallel_for(n, options.threads, [&](size_t i) {
    at::NoGradGuard no_grad;
    const data::MllmRecord& rec = records[i];
    Result& r = results[i];
    r.s.source = rec.source;
    try {
      MM_CHECK(!rec.messages.empty() && rec.messages.back().role == "assistant", rec.source,
               ": an eval record must end with the assistant's reference answer");
      r.s.reference = rec.messages.back().content;
      int letter = reference_letter(r.s.reference);
      if (letter < 0 && !rec.options.empty())
        for (size_t k = 0; k < rec.options.size(); ++k)
          if (normalize_answer(rec.options[k]) == normalize_answer(r.s.reference)) letter = static_cast<int>(k);
      r.s.task = (!rec.options.empty() || reference_letter(r.s.reference) >= 0) ? "choice" : "vqa";
      if (options.generate) {
        data::MllmRecord prompt = rec;
        prompt.messages.pop_back();
        Generation g = generate(model, sample_inputs(encoder.encode_prompt(prompt)), sampling);
        r.generated = static_cast<int64_t>(g.tokens.size());
        r.s.prediction = encoder.tokenizer().decode(g.tokens, /*skip_special_tokens=*/true);
        if (r.s.task == "choice") {
          const int got = parse_choice(r.s.prediction, rec.options);
          r.unparsed = got < 0;
          r.s.correct = got >= 0 && got == letter;
        } else {
          const std::string p = normalize_answer(r.s.prediction);
          r.exact = trim(r.s.prediction) == trim(r.s.reference);
          r.s.correct = p == normalize_answer(r.s.reference);
          if (rec.answers.empty()) {
            r.vqa_score = r.s.correct ? 1.0 : 0.0;
          } else {
            int64_t matches = 0;
            for (const auto& a : rec.answers) matches += normalize_answer(a) == p;
            r.vqa_score = std::min(1.0, static_cast<double>(matches) / 3.0);
          }
        }
      }
      if (options.loss) {
        data::Batch b =
            data::batch_to_device(data::collate_samples({encoder.encode(rec)}, {false, 1, encoder.pad_id()}), device);
        check_token_ids(b.require(data::kInputIds), model.vocab_size(), rec.source);
        models::CrossEntropySum ce =
            models::lm_cross_entropy_sum(model.forward(b)[models::kLogits], b.require(data::kLabels));
        r.s.loss = ce.sum.item<double>();
        r.s.tokens = ce.count.item<int64_t>();
      }
    } catch (const Error& e) {
      r.error = e.what();
    }
    if (progress) {
      std::lock_guard<std::mutex> lock(progress_mutex);
      progress(++done, static_cast<int64_t>(n));
    }
  });

  EvalReport rep;
  rep.samples = static_cast<int64_t>(n);
  for (auto& r : results) {
    if (!r.error.empty()) {
      ++rep.errors;
      if (rep.error_messages.size() < 10) rep.error_messages.push_back(r.error);
      continue;
    }
    rep.generated_tokens += r.generated;
    if (options.generate) {
      if (r.s.task == "choice") {
        ++rep.choice;
        rep.choice_correct += r.s.correct;
        rep.choice_unparsed += r.unparsed;
      } else {
        ++rep.vqa;
        rep.vqa_exact += r.exact;
        rep.vqa_normalized += r.s.correct;
        rep.vqa_accuracy_sum += r.vqa_score;
      }
    }
    rep.loss_sum += r.s.loss;
    rep.loss_tokens += r.s.tokens;
    if (options.keep_predictions < 0 || static_cast<int64_t>(rep.predictions.size()) < options.keep_predictions)
      rep.predictions.push_back(r.s);
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace mm::inference
