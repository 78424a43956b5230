// Subcommands of `mm`. Each add_* registers its options on the app; run_selected runs the one
// the user chose.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace mm::cli {

std::string version_text();
void add_version_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_flops_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_init_command(CLI::App& app);
void add_judge_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_memory_command(CLI::App& app);
// Registers what runs when subcommand `cmd` is the one chosen.
void register_action(CLI::App* cmd, std::function<int()> fn);
int run_selected(CLI::App& app);

}  // namespace mm::cli
