// A host that attaches to a running `troupe launch` job with its job token
// and streams its metrics until the job ends.
//
//   attach HOST PORT TOKEN_FILE
//   attach 127.0.0.1 29500 runs/20261202-0800/token
#include <caf/all.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "troupe/troupe.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: attach HOST PORT TOKEN_FILE\n");
    return 2;
  }
  std::string token;
  std::ifstream in(argv[3]);
  if (!in || !std::getline(in, token)) {
    std::fprintf(stderr, "attach: %s: cannot read the job token\n", argv[3]);
    return 2;
  }
  caf::actor_system_config cfg;
  troupe::configure_actor_system(cfg);
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  absl::StatusOr<std::unique_ptr<troupe::JobWatcher>> watcher =
      troupe::JobWatcher::attach({.host = argv[1],
                                  .port = std::atoi(argv[2]),
                                  .token = token,
                                  .connect_timeout_s = 10,
                                  .name = "launch"},
                                 caf::actor(self));
  if (!watcher.ok()) {
    std::fprintf(stderr, "attach: %s\n", std::string(watcher.status().message()).c_str());
    return 1;
  }
  std::printf("attached: %s, at step %d of %d\n", (*watcher)->hello().layout.c_str(),
              (*watcher)->hello().step, (*watcher)->hello().steps);
  int streamed = 0;
  std::string error;
  bool ended = false;
  self->receive_while([&] { return !ended; })(
      [&](troupe::metrics_atom, const std::string&, const troupe::StepMetrics& m) {
        std::printf("step %d loss %.17g\n", m.step, m.loss);
        std::fflush(stdout);
        streamed++;
      },
      [&](troupe::ended_atom, const std::string&, int steps, const std::string& why) {
        std::printf("ended after step %d%s%s\n", steps, why.empty() ? "" : ": ", why.c_str());
        error = why;
        ended = true;
      },
      [&](troupe::log_atom, const std::string&, const std::string& line) {
        std::printf("%s\n", line.c_str());  // (saves, stops, warnings)
      });  // (a blocking actor keeps what it does not match: the other events)
  std::printf("streamed %d steps\n", streamed);
  return error.empty() && streamed > 0 ? 0 : 1;
}
