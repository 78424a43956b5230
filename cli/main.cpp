// The `mm` binary: one entry point for every command. Errors a user can fix print one line and
// exit 1 (2 for configuration mistakes); nothing aborts.
#include <CLI/CLI.hpp>

#include <c10/util/Exception.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "mindspeed_mm/config/megatron_flags.h"
#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/strings.h"

int main(int argc, char** argv) {
  mm::configure_host_allocator();
  CLI::App app{"mm: train vision-language and generation models (MindSpeed-MM style), in C++"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] { return mm::cli::version_text(); });
  mm::cli::add_version_command(app);
  mm::cli::add_train_command(app);
  mm::cli::add_export_command(app);
  mm::cli::add_bench_command(app);
  mm::cli::add_tokenize_command(app);
  mm::cli::add_data_command(app);
  mm::cli::add_generate_command(app);
  mm::cli::add_eval_command(app);
  mm::cli::add_flops_command(app);
  mm::cli::add_launch_command(app);
  mm::cli::add_sample_command(app);
  mm::cli::add_init_command(app);
  mm::cli::add_judge_command(app);
  mm::cli::add_convert_command(app);
  mm::cli::add_report_command(app);
  mm::cli::add_memory_command(app);
  try {
    // `mm train` and `mm flops` take Megatron's flags (--tensor-model-parallel-size 2 ...) as
    // overrides: rewritten to key=value before parsing; a misspelt flag gets a did-you-mean.
    std::vector<std::string> args(argv, argv + argc);
    if (argc > 1 && (args[1] == "train" || args[1] == "flops" || args[1] == "memory")) {
      std::vector<std::string> own = {"--help"};
      for (const CLI::Option* o : app.get_subcommand(args[1])->get_options())
        for (const std::string& n : o->get_lnames()) own.push_back("--" + n);
      std::vector<std::string> rest = mm::config::translate_megatron_flags({args.begin() + 2, args.end()}, own);
      args.resize(2);
      args.insert(args.end(), rest.begin(), rest.end());
    }
    std::vector<char*> av;
    for (std::string& a : args) av.push_back(a.data());
    app.parse(static_cast<int>(av.size()), av.data());
    return mm::cli::run_selected(app);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and exit 0; a usage mistake is one line and exit 2 (a
    // configuration error), not CLI11's own code and "Run with --help" line.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    std::fprintf(stderr, "error: %s (mm %s--help lists the options)\n", what.c_str(),
                 argc > 1 && argv[1][0] != '-' ? (std::string(argv[1]) + " ").c_str() : "");
    return 2;
  } catch (const mm::Error& e) {
    std::fprintf(stderr, "error: %s\n", mm::one_line(e.what()).c_str());
    return e.exit_code();
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    std::fprintf(stderr, "error: %s\n", mm::one_line(msg.substr(0, msg.find('\n'))).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", mm::one_line(e.what()).c_str());
    return 1;
  }
}
