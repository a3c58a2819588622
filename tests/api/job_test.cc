// The embedding API (troupe/troupe.h): a job in the test's actor system,
// its events, stop at a chosen step, save now, status, exit, bad input.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "actors/runtime/in_process.h"
#include "troupe/troupe.h"

namespace troupe {
namespace {

caf::actor_system_config& config_with_types() {
  static caf::actor_system_config* cfg = [] {
    auto* c = new caf::actor_system_config();
    add_message_types(*c);
    return c;
  }();
  return *cfg;
}

JobConfig pp2_dp2(int steps) {
  absl::StatusOr<JobConfig> c = JobConfig::from_flags(
      {"--model", "tiny", "--pp", "2", "--dp", "2", "--micro-batch-size", "2",
       "--global-batch-size", "8", "--steps", std::to_string(steps), "--threads", "1"});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// What a subscriber heard, in order.
struct Heard {
  std::vector<StepMetrics> metrics;
  std::vector<std::string> logs;
  std::vector<std::pair<int, std::string>> checkpoints;
  std::string failure;
  int ended_steps = -1;
  std::string ended_error;
};

// Receives until ended_atom; `on_metrics` may send the job messages.
Heard listen(caf::scoped_actor& self,
             const std::function<void(const StepMetrics&)>& on_metrics = nullptr) {
  Heard h;
  bool ended = false;
  self->receive_while([&] { return !ended; })(
      [&](metrics_atom, const std::string& job, const StepMetrics& m) {
        EXPECT_EQ(job, "job");
        h.metrics.push_back(m);
        if (on_metrics) on_metrics(m);
      },
      [&](validation_atom, const std::string&, int, double) {},
      [&](log_atom, const std::string&, const std::string& line) { h.logs.push_back(line); },
      [&](checkpoint_atom, const std::string&, int step, const std::string& dir) {
        h.checkpoints.emplace_back(step, dir);
      },
      [&](stall_atom, const std::string&, const std::string&) {},
      [&](failure_atom, const std::string&, const std::string& what) { h.failure = what; },
      [&](ended_atom, const std::string&, int steps, const std::string& error) {
        h.ended_steps = steps;
        h.ended_error = error;
        ended = true;
      });
  return h;
}

// The uninterrupted run of the same configuration, through the runtime
// itself (not the API).
std::vector<StepMetrics> uninterrupted(const JobConfig& c) {
  absl::StatusOr<std::unique_ptr<actors::InProcessTrainer>> t =
      actors::InProcessTrainer::create(c.options, c.parallel);
  EXPECT_TRUE(t.ok()) << t.status();
  std::vector<StepMetrics> out;
  EXPECT_TRUE((*t)->run([&](const StepMetrics& m) { out.push_back(m); }).ok());
  return out;
}

TEST(Job, StopsAtAChosenStepWithTheUninterruptedRunsMetrics) {
  const JobConfig c = pp2_dp2(12);
  const std::vector<StepMetrics> whole = uninterrupted(c);
  ASSERT_EQ(whole.size(), 12u);
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  absl::StatusOr<caf::actor> job = spawn_job(system, c, self);
  ASSERT_TRUE(job.ok()) << job.status();
  // Asked at once, for step 5: the job ends after step 5 whatever step it
  // is at when the message arrives.
  self->send(*job, stop_atom::value, 5);
  const Heard h = listen(self);
  EXPECT_EQ(h.ended_error, "");
  EXPECT_EQ(h.ended_steps, 5);
  ASSERT_EQ(h.metrics.size(), 5u);
  for (std::size_t i = 0; i < h.metrics.size(); i++) {
    SCOPED_TRACE(i);
    EXPECT_EQ(h.metrics[i].step, whole[i].step);
    EXPECT_EQ(h.metrics[i].loss, whole[i].loss);  // bitwise
    EXPECT_EQ(h.metrics[i].grad_norm, whole[i].grad_norm);
    EXPECT_EQ(h.metrics[i].lr, whole[i].lr);
    EXPECT_EQ(h.metrics[i].consumed_samples, whole[i].consumed_samples);
  }
  ASSERT_FALSE(h.logs.empty());
  EXPECT_NE(h.logs.back().find("stop requested: ending after step 5"), std::string::npos)
      << h.logs.back();
  // After the end the handle answers its status.
  self->request(*job, caf::infinite, status_atom::value)
      .receive(
          [&](const JobStatus& st) {
            EXPECT_EQ(st.state, "ended");
            EXPECT_EQ(st.step, 5);
            EXPECT_EQ(st.steps, 12);
            EXPECT_EQ(st.pp, 2);
            EXPECT_EQ(st.dp, 2);
            EXPECT_EQ(st.layout, "tp=1 pp=2 dp=2 (4 ranks)");
            EXPECT_EQ(st.loss, whole[4].loss);
            EXPECT_GT(st.mean_tokens_per_s, 0);
          },
          [&](caf::error& e) { ADD_FAILURE() << system.render(e); });
  self->send_exit(*job, caf::exit_reason::user_shutdown);
}

TEST(Job, StopWhenALossIsSeenEndsAfterTheStepInProgress) {
  const JobConfig c = pp2_dp2(40);
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  absl::StatusOr<caf::actor> job = spawn_job(system, c, self);
  ASSERT_TRUE(job.ok()) << job.status();
  int asked_at = 0;
  const Heard h = listen(self, [&](const StepMetrics& m) {
    if (asked_at == 0 && m.step == 3) {
      asked_at = m.step;
      self->send(*job, stop_atom::value);
    }
  });
  EXPECT_EQ(h.ended_error, "");
  // The last step the coordinator had begun when the stop arrived is the
  // last: step 4, which began with step 3's update, or step 5 if the stop
  // came after step 4's update had begun it.
  EXPECT_GE(h.ended_steps, 3);
  EXPECT_LE(h.ended_steps, 5);
  EXPECT_EQ(static_cast<int>(h.metrics.size()), h.ended_steps);
}

TEST(Job, SaveNowWritesACheckpointAtTheNextStepBoundary) {
  const std::string dir = testing::TempDir() + "/job_save_now";
  std::filesystem::remove_all(dir);
  JobConfig c = pp2_dp2(6);
  c.checkpoint.save = dir;
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  absl::StatusOr<caf::actor> job = spawn_job(system, c, self);
  ASSERT_TRUE(job.ok()) << job.status();
  int asked_after = 0;
  const Heard h = listen(self, [&](const StepMetrics& m) {
    if (m.step == 2) {
      asked_after = 2;
      self->send(*job, save_now_atom::value);
    }
  });
  EXPECT_EQ(h.ended_error, "");
  EXPECT_EQ(h.ended_steps, 6);
  // One checkpoint asked for (after step 3 or 4), one at the end.
  ASSERT_EQ(h.checkpoints.size(), 2u);
  EXPECT_GE(h.checkpoints[0].first, 3);
  EXPECT_LE(h.checkpoints[0].first, 4);
  EXPECT_TRUE(std::filesystem::exists(h.checkpoints[0].second + "/manifest.json"))
      << h.checkpoints[0].second;
  EXPECT_EQ(h.checkpoints[1].first, 6);
  self->send_exit(*job, caf::exit_reason::user_shutdown);
}

TEST(Job, SaveNowWithoutSaveIsAnErrorReply) {
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  absl::StatusOr<caf::actor> job = spawn_job(system, pp2_dp2(3), self);
  ASSERT_TRUE(job.ok()) << job.status();
  bool refused = false;
  self->request(*job, caf::infinite, save_now_atom::value)
      .receive([] {},
               [&](caf::error& e) {
                 refused = true;
                 EXPECT_NE(system.render(e).find("needs --save"), std::string::npos)
                     << system.render(e);
               });
  EXPECT_TRUE(refused);
  const Heard h = listen(self);
  EXPECT_EQ(h.ended_steps, 3);
}

TEST(Job, AnExitMessageStopsTheJobAndEndsTheHandleAfterIt) {
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  absl::StatusOr<caf::actor> job = spawn_job(system, pp2_dp2(100000), self);
  ASSERT_TRUE(job.ok()) << job.status();
  self->monitor(*job);
  bool sent = false;
  const Heard h = listen(self, [&](const StepMetrics& m) {
    if (!sent && m.step == 2) {
      sent = true;
      self->send_exit(*job, caf::exit_reason::user_shutdown);
    }
  });
  EXPECT_EQ(h.ended_error, "");
  EXPECT_LE(h.ended_steps, 4);  // (step 3 or, begun with its update, step 4)
  self->receive([&](const caf::down_msg& d) { EXPECT_EQ(d.source, *job); });
}

TEST(Job, TwoJobsRunSideBySideInOneSystem) {
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  JobConfig a = pp2_dp2(4);
  a.name = "a";
  JobConfig b = pp2_dp2(6);
  b.name = "b";
  ASSERT_TRUE(spawn_job(system, a, self).ok());
  ASSERT_TRUE(spawn_job(system, b, self).ok());
  std::map<std::string, int> steps;
  std::vector<std::string> ended;
  self->receive_while([&] { return ended.size() < 2; })(
      [&](metrics_atom, const std::string& job, const StepMetrics& m) {
        EXPECT_EQ(m.step, steps[job] + 1) << job;
        steps[job] = m.step;
      },
      [&](log_atom, const std::string&, const std::string&) {},
      [&](ended_atom, const std::string& job, int n, const std::string& error) {
        EXPECT_EQ(error, "") << job;
        EXPECT_EQ(n, job == "a" ? 4 : 6);
        ended.push_back(job);
      });
  EXPECT_EQ(steps["a"], 4);
  EXPECT_EQ(steps["b"], 6);
}

TEST(Job, AMissingDataFileIsAFailureNamingIt) {
  JobConfig c = pp2_dp2(3);
  c.options.data_path = {"/nonexistent/corpus_text_document"};
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  absl::StatusOr<caf::actor> job = spawn_job(system, c, self);
  ASSERT_TRUE(job.ok()) << job.status();
  const Heard h = listen(self);
  EXPECT_EQ(h.ended_steps, 0);
  EXPECT_NE(h.ended_error.find("/nonexistent/corpus_text_document"), std::string::npos)
      << h.ended_error;
  EXPECT_EQ(h.failure, h.ended_error);
}

// A host actor that subscribes and asks to save with plain sends (no
// request): no reply comes back to it, a refused save is an event, and
// neither it nor the job dies of an unexpected message.
TEST(Job, PlainSendsGetNoReplyAndKillNothing) {
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  absl::StatusOr<caf::actor> job = spawn_job(system, pp2_dp2(4));
  ASSERT_TRUE(job.ok()) << job.status();
  auto host = system.spawn([job = *job, test = caf::actor(self)](caf::event_based_actor* h) {
    h->send(job, subscribe_atom::value, caf::actor_cast<caf::actor>(h));
    h->send(job, save_now_atom::value);  // (no --save)
    return caf::behavior{
        [=](log_atom, const std::string&, const std::string& line) {
          h->send(test, log_atom::value, std::string("host"), line);
        },
        [=](ended_atom, const std::string& name, int steps, const std::string& error) {
          h->send(test, ended_atom::value, name, steps, error);
          h->quit();
        },
        [](metrics_atom, const std::string&, const StepMetrics&) {},
    };
  });
  self->monitor(*job);
  self->monitor(host);
  const Heard h = listen(self);
  EXPECT_EQ(h.ended_error, "");
  EXPECT_EQ(h.ended_steps, 4);
  ASSERT_FALSE(h.logs.empty());
  EXPECT_NE(h.logs.front().find("not saved: job: save_now needs --save DIR"), std::string::npos)
      << h.logs.front();
  // The host ended as it meant to, normally; the job's handle lives on.
  self->receive([&](const caf::down_msg& d) {
    EXPECT_EQ(d.source, host);
    EXPECT_EQ(d.reason, caf::exit_reason::normal);
  });
  self->request(*job, caf::infinite, status_atom::value)
      .receive([](const JobStatus& st) { EXPECT_EQ(st.state, "ended"); },
               [&](caf::error& e) { ADD_FAILURE() << system.render(e); });
  self->send_exit(*job, caf::exit_reason::user_shutdown);
}

TEST(Job, ANormalExitIsIgnoredAsCafIgnoresIt) {
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  absl::StatusOr<caf::actor> job = spawn_job(system, pp2_dp2(5), self);
  ASSERT_TRUE(job.ok()) << job.status();
  self->send_exit(*job, caf::exit_reason::normal);
  const Heard h = listen(self);
  EXPECT_EQ(h.ended_steps, 5);
  self->send_exit(*job, caf::exit_reason::user_shutdown);
}

// Killed at once (before its run has a coordinator) and after a step: the
// run stops, and the system's destructor waits for the job's thread.
TEST(Job, AKilledHandleStopsTheRunAndTheSystemWaitsForIt) {
  for (int at_step : {0, 2}) {
    SCOPED_TRACE(at_step);
    std::atomic<int> last{0};
    {
      caf::actor_system system{config_with_types()};
      caf::scoped_actor self{system};
      absl::StatusOr<caf::actor> job = spawn_job(system, pp2_dp2(100000), self);
      ASSERT_TRUE(job.ok()) << job.status();
      if (at_step == 0) {
        caf::anon_send_exit(*job, caf::exit_reason::kill);
      } else {
        bool killed = false;
        self->receive_while([&] { return !killed; })(
            [&](metrics_atom, const std::string&, const StepMetrics& m) {
              last = m.step;
              if (m.step >= at_step) {
                caf::anon_send_exit(*job, caf::exit_reason::kill);
                killed = true;
              }
            },
            [](log_atom, const std::string&, const std::string&) {});
      }
    }  // (the destructor returns once the run has stopped)
    EXPECT_LT(last.load(), 100);
  }
}

TEST(Job, TwoJobsMayNotShareASaveDirectory) {
  const std::string dir = testing::TempDir() + "/job_shared_save";
  std::filesystem::remove_all(dir);
  caf::actor_system system{config_with_types()};
  caf::scoped_actor self{system};
  JobConfig a = pp2_dp2(3);
  a.name = "a";
  a.checkpoint.save = dir;
  JobConfig b = a;
  b.name = "b";
  b.checkpoint.save = dir + "/.";  // the same directory, spelt otherwise
  ASSERT_TRUE(spawn_job(system, a, self).ok());
  absl::StatusOr<caf::actor> second = spawn_job(system, b, self);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("--save"), std::string::npos) << second.status();
  EXPECT_NE(second.status().message().find("job a"), std::string::npos) << second.status();
  self->receive([](ended_atom, const std::string&, int, const std::string&) {});
  // Once a has ended, its directory is free again.
  absl::StatusOr<caf::actor> third = spawn_job(system, b, self);
  EXPECT_TRUE(third.ok()) << third.status();
}

// troupe's scheduler settings where the host has none, the host's own
// where it has (made before the call, or after it).
TEST(ConfigureActorSystem, SetsTwoSleepingWorkersUnlessTheHostChoseOtherwise) {
  auto setting = [](const caf::actor_system_config& cfg, const char* name) {
    return caf::get_or(cfg, name, std::size_t{12345});
  };
  caf::actor_system_config fresh;
  configure_actor_system(fresh);
  EXPECT_EQ(setting(fresh, "scheduler.max-threads"), 2u);
  EXPECT_EQ(setting(fresh, "work-stealing.moderate-poll-attempts"), 0u);

  caf::actor_system_config before;
  before.set("scheduler.max-threads", std::size_t{6});
  configure_actor_system(before);
  EXPECT_EQ(setting(before, "scheduler.max-threads"), 6u);
  EXPECT_EQ(setting(before, "work-stealing.moderate-poll-attempts"), 0u);

  caf::actor_system_config after;
  configure_actor_system(after);
  after.set("work-stealing.moderate-poll-attempts", std::size_t{500});
  EXPECT_EQ(setting(after, "work-stealing.moderate-poll-attempts"), 500u);
  EXPECT_EQ(setting(after, "scheduler.max-threads"), 2u);
}

TEST(JobConfig, FromFlagsRefusesTheCommandLinesOwnAndNamesBadFlags) {
  for (const char* flag : {"--print-config", "--exit-signal-handler"}) {
    absl::StatusOr<JobConfig> c = JobConfig::from_flags({"--model", "tiny", flag});
    ASSERT_FALSE(c.ok()) << flag;
    EXPECT_NE(c.status().message().find(flag), std::string::npos) << c.status();
  }
  absl::StatusOr<JobConfig> c = JobConfig::from_flags({"--metrics-jsonl", "m.jsonl"});
  EXPECT_FALSE(c.ok());
  c = JobConfig::from_flags({"--no-such-flag"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--no-such-flag"), std::string::npos) << c.status();
  c = JobConfig::from_flags({"--model", "nope"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--model"), std::string::npos) << c.status();
  c = JobConfig::from_flags({"--model", "tiny", "--pp", "3"});  // 4 layers on 3 stages
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--pp"), std::string::npos) << c.status();
}

TEST(JobConfig, CodeFilledConfigIsCheckedBySpawn) {
  caf::actor_system system{config_with_types()};
  JobConfig c = pp2_dp2(3);
  c.parallel.dp = 3;  // 8 sequences do not split over 3 replicas
  absl::StatusOr<caf::actor> job = spawn_job(system, c);
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("--dp"), std::string::npos) << job.status();
  c = pp2_dp2(3);
  c.name = "";
  EXPECT_FALSE(spawn_job(system, c).ok());
}

}  // namespace
}  // namespace troupe
