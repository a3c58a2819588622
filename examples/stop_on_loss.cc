// A host actor that starts a pp2 x dp2 job, prints its metrics as they
// come, and stops it as soon as a step's loss is below a threshold (the
// job ends at the next step boundary).
//
//   stop_on_loss [THRESHOLD] [troupe train flags...]
//   stop_on_loss 6.0 --model tiny --steps 300
#include <caf/all.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "troupe/troupe.h"

namespace {

struct Outcome {
  int stopped_at = 0;  // the step whose loss was below the threshold (0: none)
  int ended_after = 0;
  std::string error;
};

caf::behavior host(caf::event_based_actor* self, troupe::JobConfig config, double threshold,
                   Outcome* out) {
  absl::StatusOr<caf::actor> job =
      troupe::spawn_job(self->system(), config, caf::actor_cast<caf::actor>(self));
  if (!job.ok()) {
    out->error = std::string(job.status().message());
    self->quit();
    return {};
  }
  self->set_default_handler(caf::drop);  // (events this host does not use)
  return {
      [=](troupe::metrics_atom, const std::string& name, const troupe::StepMetrics& m) {
        std::printf("%s: step %d loss %.4f (%.0f tokens/s)\n", name.c_str(), m.step, m.loss,
                    m.tokens_per_s);
        if (m.loss < threshold && out->stopped_at == 0) {
          out->stopped_at = m.step;
          std::printf("loss below %.3f: stopping after step %d\n", threshold, m.step);
          // It ends after the last step begun when the stop arrives: the
          // next one (a step begins with the update of the one before it,
          // so metrics arrive as the next step runs), or the one after it
          // if the stop comes after the next one's update.
          self->send(*job, troupe::stop_atom::value);
        }
      },
      [=](troupe::log_atom, const std::string& name, const std::string& line) {
        std::printf("%s: %s\n", name.c_str(), line.c_str());
      },
      [=](troupe::ended_atom, const std::string& name, int steps, const std::string& error) {
        std::printf("%s: ended after step %d%s%s\n", name.c_str(), steps, error.empty() ? "" : ": ",
                    error.c_str());
        out->ended_after = steps;
        out->error = error;
        self->quit();
      },
  };
}

}  // namespace

int main(int argc, char** argv) {
  const double threshold = argc > 1 ? std::atof(argv[1]) : 6.0;
  std::vector<std::string> flags = {"--model",
                                    "tiny",
                                    "--pp",
                                    "2",
                                    "--dp",
                                    "2",
                                    "--micro-batch-size",
                                    "2",
                                    "--global-batch-size",
                                    "8",
                                    "--steps",
                                    "300",
                                    "--threads",
                                    "1"};
  for (int i = 2; i < argc; i++) flags.push_back(argv[i]);  // (later flags win)
  absl::StatusOr<troupe::JobConfig> config = troupe::JobConfig::from_flags(flags);
  if (!config.ok()) {
    std::fprintf(stderr, "stop_on_loss: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  Outcome out;
  {
    caf::actor_system_config cfg;
    troupe::configure_actor_system(cfg);
    caf::actor_system system{cfg};
    system.spawn(host, *config, threshold, &out);
  }  // (the system waits for the host and the job)
  if (!out.error.empty()) {
    std::fprintf(stderr, "stop_on_loss: %s\n", out.error.c_str());
    return 1;
  }
  if (out.stopped_at == 0) {
    std::printf("the loss never fell below %.3f\n", threshold);
    return 1;
  }
  const bool at_once = out.ended_after >= out.stopped_at && out.ended_after <= out.stopped_at + 2;
  return at_once ? 0 : 1;
}
