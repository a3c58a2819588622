// troupe: train GPT models with 3D parallelism on an actor runtime.
//
//   troupe train --model tiny --steps 50
//   troupe preprocess --input pile.jsonl.zst --output-prefix data/pile --vocab-file ...
//   --merge-file ... troupe data info data/pile_text_document troupe <command> --help
#include <cstdio>
#include <map>
#include <string>

#include "launcher/commands.h"
#include "launcher/exit_codes.h"

int main(int argc, char** argv) {
  CLI::App app{"troupe: GPT training with tensor, pipeline and data parallelism on actors",
               "troupe"};
  app.require_subcommand(1);
  std::map<std::string, troupe::launcher::Command> commands;
  commands["train"] = troupe::launcher::add_train_command(app);
  commands["launch"] = troupe::launcher::add_launch_command(app);
  commands["worker"] = troupe::launcher::add_worker_command(app);
  commands["agent"] = troupe::launcher::add_agent_command(app);
  commands["data"] = troupe::launcher::add_data_command(app);
  commands["preprocess"] = troupe::launcher::add_preprocess_command(app);
  commands["ckpt"] = troupe::launcher::add_ckpt_command(app);
  commands["trace"] = troupe::launcher::add_trace_command(app);
  commands["plan"] = troupe::launcher::add_plan_command(app);
  commands["generate"] = troupe::launcher::add_generate_command(app);
  commands["eval"] = troupe::launcher::add_eval_command(app);
  commands["serve"] = troupe::launcher::add_serve_command(app);
  commands["watch"] = troupe::launcher::add_watch_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (CLI::App* sub : app.get_subcommands()) return commands[sub->get_name()]();
  return troupe::launcher::kExitUsage;
}
