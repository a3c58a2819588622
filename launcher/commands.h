// The troupe command's subcommands. Each registers its flags on the CLI11
// app and returns the function to run once the command line is parsed; that
// function returns the process exit code (errors are printed by it, naming
// the flag or file at fault).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string_view>

#include "absl/status/status.h"

namespace troupe::launcher {

using Command = std::function<int()>;

// Prints "troupe COMMAND: error: MESSAGE" on stderr and returns kExitFailed
// (launcher/exit_codes.h), for a command's `return command_failed(...)`:
//   if (!weights.ok()) return command_failed("eval", weights.status());
int command_failed(std::string_view command, const absl::Status& st);

Command add_train_command(CLI::App& app);
Command add_data_command(CLI::App& app);
Command add_preprocess_command(CLI::App& app);
Command add_worker_command(CLI::App& app);
Command add_launch_command(CLI::App& app);
Command add_agent_command(CLI::App& app);
Command add_ckpt_command(CLI::App& app);
Command add_trace_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_watch_command(CLI::App& app);

}  // namespace troupe::launcher
