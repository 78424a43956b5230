// Input encoders: frozen models a run applies to each batch on the training device before the
// objective's prepare(), so the trained model sees their outputs (online encoding: a video
// model's VAE and text encoder turning clips and captions into latents and text features every
// step, where `mm data extract-features` would have written them once). model.encoders picks
// one by id; a new family's encoders are one new file here plus its registration (see wan.cpp).
// They hold no trainable parameters, are never checkpointed, and run the same on every rank
// (each on its own micro-batches), so any parallel layout of the trained model takes them.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/registry.h"
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/model.h"

namespace mm::training {

class InputEncoder {
 public:
  virtual ~InputEncoder() = default;
  // Fields a batch must have (checked against the dataset's at start) and those encode() adds.
  virtual std::vector<std::string> required_fields() const = 0;
  virtual std::vector<std::string> provided_fields() const = 0;
  // ConfigError when the trained model cannot take what this produces (a text width that differs).
  virtual void check(const models::Model& model) const {}
  // Adds the provided fields to `device` (a batch on the training device) and drops the inputs it
  // consumed there; `host` (the loader's CPU copy, which counts and FLOPs are read from) gets the
  // provided fields too, as CPU tensors. No gradient flows into the encoders.
  virtual void encode(data::Batch& device, data::Batch& host) const = 0;
  // Forward FLOPs the encoders spend on a batch, by part ("vae (frozen)", "text encoder
  // (frozen)"), read from the host batch before encode(): the step's FLOPs and MFU include them
  // and the profile summary lists them as parts.
  virtual std::vector<std::pair<std::string, double>> flops_by_part(const data::Batch& host) const { return {}; }
  // What the run's first lines say ("wan: VAE 1.2M + umT5 3.4M parameters, frozen").
  virtual std::string describe() const = 0;
};

// Encoders by id ("wan"): a factory from the run's config and the training device.
using InputEncoderFactory = std::function<std::unique_ptr<InputEncoder>(const config::Config&, at::Device)>;
Registry<InputEncoderFactory>& input_encoder_registry();

// model.encoders' encoder on `device`, or none when model.encoders.id is empty.
std::unique_ptr<InputEncoder> make_input_encoder(const config::Config& cfg, at::Device device);

}  // namespace mm::training
