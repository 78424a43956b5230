// Megatron-LM's command-line flags as `mm train` / `mm flops` overrides: users coming from
// Megatron or MindSpeed-MM type `--tensor-model-parallel-size 2 --sequence-parallel` and get the
// config keys those flags mean (`parallel.tensor_parallel_size=2 parallel.sequence_parallel=true`).
#pragma once

#include <string>
#include <vector>

namespace mm::config {

struct MegatronFlag {
  const char* flag;   // "--tensor-model-parallel-size"
  const char* key;    // "parallel.tensor_parallel_size"
  const char* fixed;  // a switch's value ("true", "bf16"); nullptr: the flag takes a value
};

// The flags understood, in the order the help lists them.
const std::vector<MegatronFlag>& megatron_flags();

// `args` with each Megatron flag ("--flag V", "--flag=V", or a switch) replaced by its "key=value"
// override; everything else kept in place. A "--name" that is neither a Megatron flag nor one of
// `own_options` (the command's own, e.g. "--print-config") is a ConfigError:
// "config: unknown flag '--x' on the command line, did you mean '--y'?"; so is a flag missing
// its value.
std::vector<std::string> translate_megatron_flags(const std::vector<std::string>& args,
                                                  const std::vector<std::string>& own_options);

}  // namespace mm::config
