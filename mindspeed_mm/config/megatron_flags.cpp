#include "mindspeed_mm/config/megatron_flags.h"

#include <algorithm>

#include "mindspeed_mm/config/config_io.h"
#include "mindspeed_mm/core/errors.h"

namespace mm::config {

const std::vector<MegatronFlag>& megatron_flags() {
  static const std::vector<MegatronFlag> flags = {
      {"--tensor-model-parallel-size", "parallel.tensor_parallel_size", nullptr},
      {"--pipeline-model-parallel-size", "parallel.pipeline_parallel_size", nullptr},
      {"--virtual-pipeline-model-parallel-size", "parallel.virtual_pipeline_size", nullptr},
      {"--num-layers-per-virtual-pipeline-stage", "parallel.num_layers_per_virtual_pipeline_stage", nullptr},
      {"--context-parallel-size", "parallel.context_parallel_size", nullptr},
      {"--context-parallel-algo", "parallel.context_parallel_algo", nullptr},
      {"--ulysses-degree-in-cp", "parallel.ulysses_degree_in_cp", nullptr},
      {"--sequence-parallel", "parallel.sequence_parallel", "true"},
      {"--use-distributed-optimizer", "parallel.distributed_optimizer", "true"},
      {"--micro-batch-size", "training.micro_batch_size", nullptr},
      {"--global-batch-size", "training.global_batch_size", nullptr},
      {"--train-iters", "training.train_iters", nullptr},
      {"--lr", "training.optimizer.lr", nullptr},
      {"--weight-decay", "training.optimizer.weight_decay", nullptr},
      {"--clip-grad", "training.clip_grad", nullptr},
      {"--seed", "training.seed", nullptr},
      {"--bf16", "training.precision", "bf16"},
      {"--save", "training.save_dir", nullptr},
      {"--save-interval", "training.save_interval", nullptr},
      {"--eval-iters", "training.eval_iters", nullptr},
      {"--eval-interval", "training.eval_interval", nullptr},
  };
  return flags;
}

std::vector<std::string> translate_megatron_flags(const std::vector<std::string>& args,
                                                  const std::vector<std::string>& own_options) {
  std::vector<std::string> out;
  const auto& flags = megatron_flags();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {  // the rest is not ours
      out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) {
      out.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    if (std::find(own_options.begin(), own_options.end(), name) != own_options.end()) {
      out.push_back(a);
      continue;
    }
    auto f = std::find_if(flags.begin(), flags.end(), [&](const MegatronFlag& m) { return name == m.flag; });
    if (f == flags.end()) {
      std::vector<std::string> known = own_options;
      for (const auto& m : flags) known.push_back(m.flag);
      const std::string hint = suggest(name, known);
      throw ConfigError(cat("config: unknown flag '", name, "' on the command line",
                            hint.empty() ? std::string(" (Megatron flags: `mm train --help`)")
                                         : cat(", did you mean '", hint, "'?")));
    }
    std::string value;
    if (f->fixed) {
      if (eq != std::string::npos)
        throw ConfigError(cat("config: flag '", name, "' on the command line takes no value (it sets ", f->key, "=",
                              f->fixed, ")"));
      value = f->fixed;
    } else if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size() && args[i + 1].compare(0, 2, "--") != 0) {
      value = args[++i];
    } else {
      throw ConfigError(cat("config: flag '", name, "' on the command line needs a value (it sets ", f->key, ")"));
    }
    out.push_back(cat(f->key, "=", value));
  }
  return out;
}

}  // namespace mm::config
