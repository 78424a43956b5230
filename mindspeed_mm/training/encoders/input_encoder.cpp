#include "mindspeed_mm/training/encoders/input_encoder.h"

namespace mm::training {

Registry<InputEncoderFactory>& input_encoder_registry() {
  static Registry<InputEncoderFactory> r("input encoder");
  return r;
}

std::unique_ptr<InputEncoder> make_input_encoder(const config::Config& cfg, at::Device device) {
  const config::EncodersConfig& e = cfg.model.encoders;
  if (e.id.empty()) {
    if (!e.path.empty()) throw ConfigError("config: model.encoders.path is set but model.encoders.id is not (e.g. wan)");
    return nullptr;
  }
  return input_encoder_registry().get(e.id, "model.encoders.id")(cfg, device);
}

}  // namespace mm::training
