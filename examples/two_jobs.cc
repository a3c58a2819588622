// A host that runs two small jobs side by side in one actor system and
// reports which finished first.
//
//   two_jobs
#include <caf/all.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "troupe/troupe.h"

namespace {

struct Race {
  std::vector<std::string> finished;  // in order
  std::string error;
};

caf::behavior host(caf::event_based_actor* self, std::vector<troupe::JobConfig> jobs, Race* race) {
  for (const troupe::JobConfig& c : jobs) {
    absl::StatusOr<caf::actor> job =
        troupe::spawn_job(self->system(), c, caf::actor_cast<caf::actor>(self));
    if (!job.ok()) {
      race->error = c.name + ": " + std::string(job.status().message());
      self->quit();
      return {};
    }
    std::printf("started %s\n", c.name.c_str());
  }
  self->set_default_handler(caf::drop);
  const std::size_t n = jobs.size();
  return {
      [=](troupe::metrics_atom, const std::string& name, const troupe::StepMetrics& m) {
        std::printf("%s: step %d loss %.4f\n", name.c_str(), m.step, m.loss);
      },
      [=](troupe::ended_atom, const std::string& name, int steps, const std::string& error) {
        if (!error.empty()) race->error = name + ": " + error;
        race->finished.push_back(name);
        std::printf("%s finished %s (%d steps)\n", name.c_str(),
                    race->finished.size() == 1 ? "first" : "next", steps);
        if (race->finished.size() == n) self->quit();
      },
  };
}

troupe::JobConfig job(const std::string& name, std::vector<std::string> flags) {
  for (const char* f : {"--model", "tiny", "--micro-batch-size", "2", "--global-batch-size", "8",
                        "--threads", "1"}) {
    flags.push_back(f);
  }
  absl::StatusOr<troupe::JobConfig> c = troupe::JobConfig::from_flags(flags);
  if (!c.ok()) {
    std::fprintf(stderr, "two_jobs: %s\n", std::string(c.status().message()).c_str());
    std::exit(2);
  }
  c->name = name;
  return *c;
}

}  // namespace

int main() {
  // A short pipeline job and a longer data-parallel one.
  std::vector<troupe::JobConfig> jobs = {job("pp2", {"--pp", "2", "--steps", "10"}),
                                         job("dp2", {"--dp", "2", "--steps", "30"})};
  Race race;
  {
    caf::actor_system_config cfg;
    troupe::configure_actor_system(cfg);
    caf::actor_system system{cfg};
    system.spawn(host, jobs, &race);
  }
  if (!race.error.empty()) {
    std::fprintf(stderr, "two_jobs: %s\n", race.error.c_str());
    return 1;
  }
  std::printf("%s finished first\n", race.finished.front().c_str());
  return race.finished.size() == 2 ? 0 : 1;
}
