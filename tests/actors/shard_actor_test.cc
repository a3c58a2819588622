// A shard actor alone: it says what it waits for when asked, a failed peer
// becomes an error to the coordinator naming the stage (no hang), and the
// next step's begin_step during a step waits for the step's end.
#include "actors/shard_actor.h"

#include <gtest/gtest.h>

#include "actors/messages.h"
#include "comm/inproc_transport.h"
#include "model/data/datasets.h"

namespace troupe::actors {
namespace {

// Stage 1 of a 2-stage tiny model, alone, begun by a scripted coordinator
// (`self`): its peer (rank 0) is an in-process endpoint nobody drives.
struct StageOne {
  model::GptConfig config = *model::preset("tiny");
  comm::Layout shape{.pp = 2, .dp = 1, .virtual_stages = 1};
  absl::StatusOr<model::data::Datasets> data;
  std::unique_ptr<gpu::Stream> stream = gpu::cpu_device().make_stream({.threads = 1});
  std::shared_ptr<comm::InProcFabric> fabric = std::make_shared<comm::InProcFabric>(2);
  std::unique_ptr<comm::Transport> transport = fabric->endpoint(1);
  GptStage stage{config, 2, chunk_spec(config, shape, 1), 2, gpu::cpu_device()};
  // (After what the shard uses: the system's end waits for the actor.)
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<caf::scoped_actor> self;
  caf::actor shard;
  absl::Status ready;

  StageOne() {
    model::data::DataOptions options;  // the synthetic phrase corpus
    options.T = config.T;
    options.V = config.V;
    data = model::data::build_datasets(options, 8, 0);
    ready = data.ok() ? stage.gpt().init(1) : data.status();
    if (!ready.ok()) return;
    add_message_types(cfg);
    cfg.set("scheduler.max-threads", 2);
    sys = std::make_unique<caf::actor_system>(cfg);
    self = std::make_unique<caf::scoped_actor>(*sys);
    ShardSetup ss;
    ss.rank = 1;
    ss.coord = {.d = 0, .s = 1, .t = 0};
    ss.layout = {.tp = 1, .pp = 2, .dp = 1};
    ss.shape = shape;
    ss.m = 2;
    ss.B = 2;
    ss.T = config.T;
    ss.global_batch = 4;
    ss.data = data->train.get();
    ss.chunks = {&stage};
    ss.stream = stream.get();
    ss.transport = transport.get();
    ss.grad_pieces = grad_pieces(pipeline_chunks(config, shape), shape);
    ss.param_pieces = param_pieces(pipeline_chunks(config, shape), shape);
    ss.coordinator = *self;
    shard = sys->spawn<ShardActor>(ss);
    (*self)->monitor(shard);
  }
};

TEST(ShardActor, ReportsWhatItWaitsForAndFailsWhenItsPeerDies) {
  StageOne one;
  ASSERT_TRUE(one.ready.ok()) << one.ready;
  caf::actor_system& sys = *one.sys;
  caf::scoped_actor& coordinator = *one.self;
  const caf::actor& shard = one.shard;
  comm::Transport* transport = one.transport.get();
  gpu::Stream* stream = one.stream.get();

  coordinator->send(shard, begin_step_atom::value, 1, std::int64_t{0}, 1.0f);
  coordinator->request(shard, caf::infinite, waiting_atom::value)
      .receive(
          [&](const WaitReport& r) {
            EXPECT_EQ(r.rank, 1);
            EXPECT_EQ(r.step, 1);
            EXPECT_EQ(r.op_id, 0);
            EXPECT_EQ(r.op, "forward of micro-batch 0 (chunk 0)");
            EXPECT_EQ(r.waiting, "the activation from rank 0");
            EXPECT_EQ(r.peer, 0);
            EXPECT_NE(to_string(r).find("waiting for the activation from rank 0"),
                      std::string::npos)
                << to_string(r);
          },
          [&](const caf::error& e) { FAIL() << sys.render(e); });

  // Stage 0 dies: the pending receive completes with an error, and the
  // coordinator hears which stage could not go on.
  transport->fail_peer(0, absl::UnavailableError("rank 0 is gone"));
  bool told = false;
  coordinator->receive(
      [&](failed_atom, int rank, const std::string& what) {
        told = true;
        EXPECT_EQ(rank, 1);
        EXPECT_NE(what.find("stage 1 (replica 0): receiving activation"), std::string::npos)
            << what;
        EXPECT_NE(what.find("rank 0 is gone"), std::string::npos) << what;
      },
      caf::after(std::chrono::seconds(60)) >> [&] { FAIL() << "no failure reported"; });
  EXPECT_TRUE(told);

  coordinator->send_exit(shard, caf::exit_reason::user_shutdown);
  coordinator->receive([](const caf::down_msg&) {});
  // The forward was on the stream behind the receive's gate: the failed
  // receive failed the stream, and the forward was skipped.
  const absl::Status st = stream->synchronize();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_EQ(st.message(), "receiving the activation from rank 0: rank 0 is gone");
}

// The next step's begin_step, come during a step (the coordinator begins
// step k+1 with step k's update), is held: the shard stays in its step.
// Any other begin_step during a step is an error naming both steps.
TEST(ShardActor, HoldsTheNextStepsBeginDuringAStepAndRefusesAnyOther) {
  StageOne one;
  ASSERT_TRUE(one.ready.ok()) << one.ready;
  caf::scoped_actor& self = *one.self;  // the coordinator

  self->send(one.shard, begin_step_atom::value, 1, std::int64_t{0}, 1.0f);
  self->send(one.shard, begin_step_atom::value, 2, std::int64_t{4}, 1.0f);
  self->request(one.shard, caf::infinite, waiting_atom::value)
      .receive(
          [&](const WaitReport& r) {
            EXPECT_EQ(r.step, 1);  // still step 1's first forward
            EXPECT_EQ(r.op_id, 0);
            EXPECT_EQ(r.waiting, "the activation from rank 0");
          },
          [&](const caf::error& e) { FAIL() << one.sys->render(e); });
  self->send(one.shard, begin_step_atom::value, 2, std::int64_t{4}, 1.0f);
  bool told = false;
  self->receive(
      [&](failed_atom, int rank, const std::string& what) {
        told = true;
        EXPECT_EQ(rank, 1);
        EXPECT_NE(what.find("begin_step 2 came during step 1 with the next one already held"),
                  std::string::npos)
            << what;
      },
      caf::after(std::chrono::seconds(60)) >> [&] { FAIL() << "no failure reported"; });
  EXPECT_TRUE(told);
  self->send_exit(one.shard, caf::exit_reason::user_shutdown);
  self->receive([](const caf::down_msg&) {});
  one.transport->fail_peer(0, absl::UnavailableError("the test is over"));
  (void)one.stream->synchronize();
}

// A setup whose schedule cannot be made (interleaved with m not a multiple
// of pp) is an error to the coordinator naming the stage and the problem,
// not a dereference of the failed StatusOr in the constructor.
TEST(ShardActor, AScheduleThatCannotBeMadeIsAnErrorToTheCoordinator) {
  caf::actor_system_config cfg;
  add_message_types(cfg);
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{cfg};
  caf::scoped_actor coordinator{sys};

  model::GptConfig config = *model::preset("tiny");
  const comm::Layout shape{.pp = 2, .dp = 1, .virtual_stages = 2};
  gpu::Device& dev = gpu::cpu_device();
  auto stream = dev.make_stream({.threads = 1});
  auto fabric = std::make_shared<comm::InProcFabric>(2);
  std::unique_ptr<comm::Transport> transport = fabric->endpoint(0);
  GptStage c0(config, 1, chunk_spec(config, shape, 0), 1, dev);
  GptStage c1(config, 1, chunk_spec(config, shape, 2), 1, dev);

  ShardSetup ss;
  ss.rank = 0;
  ss.coord = {.d = 0, .s = 0, .t = 0};
  ss.layout = {.tp = 1, .pp = 2, .dp = 1};
  ss.shape = shape;
  ss.schedule = ScheduleKind::kInterleaved1F1B;
  ss.m = 3;  // not a multiple of pp = 2
  ss.B = 1;
  ss.T = config.T;
  ss.global_batch = 3;
  ss.chunks = {&c0, &c1};
  ss.stream = stream.get();
  ss.transport = transport.get();
  ss.coordinator = coordinator;
  caf::actor shard = sys.spawn<ShardActor>(ss);
  bool told = false;
  coordinator->receive(
      [&](failed_atom, int rank, const std::string& what) {
        told = true;
        EXPECT_EQ(rank, 0);
        EXPECT_NE(what.find("stage 0 (replica 0): no schedule: interleaved schedule: the 3 "
                            "micro-batches per step must be a multiple of --pp 2"),
                  std::string::npos)
            << what;
      },
      caf::after(std::chrono::seconds(60)) >> [&] { FAIL() << "no failure reported"; });
  EXPECT_TRUE(told);
  // It goes on answering, and a step it is asked to begin does nothing.
  coordinator->send(shard, begin_step_atom::value, 1, std::int64_t{0}, 1.0f);
  coordinator->request(shard, caf::infinite, waiting_atom::value)
      .receive([&](const WaitReport& r) { EXPECT_EQ(r.step, 0); },
               [&](const caf::error& e) { FAIL() << sys.render(e); });
  coordinator->monitor(shard);
  coordinator->send_exit(shard, caf::exit_reason::user_shutdown);
  coordinator->receive([](const caf::down_msg&) {});
  ASSERT_TRUE(stream->synchronize().ok());
}

}  // namespace
}  // namespace troupe::actors
