// The `data` config section in the types of the mllm pipeline (shared by `mm train` and
// `mm data inspect`, so both read a dataset the same way).
#pragma once

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/sample_encoder.h"

namespace mm::data {

// ConfigError for inconsistent processor settings.
SampleEncoderOptions encoder_options(const config::DataConfig& c);
// data.tokenizer: "byte" (byte_chat_tokenizer) or an HF tokenizer directory / tokenizer.json.
PretrainedTokenizer mllm_tokenizer(const config::DataConfig& c);

}  // namespace mm::data
