// Hugging Face config.json of every model family mm builds (Qwen2, Qwen2-VL / Qwen2.5-VL and
// their vision towers, LLaVA and its CLIP tower, umT5, the Wan DiT and VAE), strict and lenient:
// any bytes as JSON. A config that is accepted writes back to JSON that reads to the same JSON.
#include "fuzz_util.h"
#include "mindspeed_mm/models/llava/llava.h"
#include "mindspeed_mm/models/qwen2/qwen2.h"
#include "mindspeed_mm/models/qwen2vl/qwen2vl.h"
#include "mindspeed_mm/models/qwen2vl/vision.h"
#include "mindspeed_mm/models/umt5/umt5.h"
#include "mindspeed_mm/models/wan/wan_dit.h"
#include "mindspeed_mm/models/wan/wan_vae.h"

namespace {

// from_json(to_json(c)) gives the same JSON again: what is written is what was understood.
template <class C, class Read>
void round_trip(const C& c, const Read& read) {
  const nlohmann::json once = c.to_json();
  if (read(once).to_json() != once) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // nlohmann's own parser is not ours to fuzz
  using namespace mm::models;
  const std::string src = "fuzz/config.json";
  for (const bool strict : {false, true}) {
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS(round_trip(Qwen2Config::from_json(j, src, strict),
                                             [&](const nlohmann::json& x) { return Qwen2Config::from_json(x, src, strict); }));
    for (const bool q25 : {false, true})
      MM_FUZZ_EXPECT_ONLY_MM_ERRORS(round_trip(Qwen2VLConfig::from_json(j, src, strict, q25), [&](const nlohmann::json& x) {
        return Qwen2VLConfig::from_json(x, src, strict, q25);
      }));
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS(round_trip(LlavaConfig::from_json(j, src, strict),
                                             [&](const nlohmann::json& x) { return LlavaConfig::from_json(x, src, strict); }));
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS(round_trip(UMT5Config::from_json(j, src, strict),
                                             [&](const nlohmann::json& x) { return UMT5Config::from_json(x, src, strict); }));
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS((void)WanDiTConfig::from_json(j, src, strict));
  }
  for (const bool q25 : {false, true})
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS(round_trip(Qwen2VLVisionConfig::from_json(j, src, q25), [&](const nlohmann::json& x) {
      return Qwen2VLVisionConfig::from_json(x, src, q25);
    }));
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS(round_trip(ClipVisionConfig::from_json(j, src),
                                           [&](const nlohmann::json& x) { return ClipVisionConfig::from_json(x, src); }));
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS((void)WanVAEConfig::from_json(j, src));
  return 0;
}
