// What the subcommands share (launcher/commands.h).
#include "launcher/commands.h"

#include <cstdio>
#include <string>

#include "launcher/exit_codes.h"

namespace troupe::launcher {

int command_failed(std::string_view command, const absl::Status& st) {
  std::fprintf(stderr, "troupe %s: error: %s\n", std::string(command).c_str(),
               std::string(st.message()).c_str());
  return kExitFailed;
}

}  // namespace troupe::launcher
