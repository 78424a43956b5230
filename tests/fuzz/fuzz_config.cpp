// The YAML training config with key=value overrides, as `mm train CONFIG k=v ...` reads them:
// the input is the YAML text, then (after a NUL byte) one override per line. Every failure is a
// ConfigError naming the file or key; deep nesting and anchors included.
#include "fuzz_util.h"
#include "mindspeed_mm/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string yaml = in.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    std::istringstream rest(in.substr(nul + 1));
    for (std::string line; std::getline(rest, line);) overrides.push_back(line);
  }
  for (const bool for_training : {false, true})
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
      const mm::config::Config c = mm::config::parse_config(yaml, "fuzz.yaml", overrides, for_training);
      (void)mm::config::parse_config(mm::config::to_yaml(c), "fuzz-again.yaml", {}, false);
    });
  return 0;
}
