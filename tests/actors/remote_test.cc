// Control messages across processes (actors/runtime/remote.h, coordinator_host.h):
// values arrive bit for bit, frames that are not control messages are
// refused before their values are read, and a rank that holds the token but
// sends what it may not is cut off with an error naming it.
#include "actors/runtime/remote.h"

#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <future>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actors/messages.h"
#include "actors/runtime/coordinator_host.h"
#include "actors/runtime/watch_feed.h"
#include "actors/runtime/worker.h"
#include "comm/control_channel.h"

namespace troupe::actors {
namespace {

// A host for a two-stage job of the tiny model on this host.
CoordinatorHostOptions two_stage_host() {
  CoordinatorHostOptions o;
  o.options.model = *model::preset("tiny");
  o.options.global_batch = o.options.micro_batch;
  o.parallel.pp = 2;
  o.listen_host = "127.0.0.1";
  o.token = "0123456789abcdef-remote-test";
  o.join_timeout = absl::Seconds(30);
  o.log = [](const std::string&) {};
  return o;
}

class RemoteTest : public ::testing::Test {
 protected:
  RemoteTest() {
    add_message_types(cfg_);
    cfg_.set("scheduler.max-threads", 1);
    sys_ = std::make_unique<caf::actor_system>(cfg_);
  }
  Envelope round_trip(const Envelope& e) {
    absl::StatusOr<Envelope> back = decode_envelope(*sys_, encode_envelope(*sys_, e));
    EXPECT_TRUE(back.ok()) << back.status();
    return back.ok() ? *back : Envelope{};
  }
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
};

TEST_F(RemoteTest, AHelloCarriesItsDevice) {
  const RankHello h{.host = "h",
                    .pid = 7,
                    .transport_address = "x",
                    .has_valid = true,
                    .train_data = "d",
                    .device = "cuda",
                    .device_name = "cuda:3 (a GPU)"};
  absl::StatusOr<RankHello> back = decode_hello(*sys_, encode_hello(*sys_, h));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->device, "cuda");
  EXPECT_EQ(back->device_name, "cuda:3 (a GPU)");
  EXPECT_EQ(back->pid, 7);
  EXPECT_EQ(back->train_data, "d");
}

TEST(DeviceKind, NamesTheCpuTheOpaqueCpuApart) {
  EXPECT_EQ(device_kind(gpu::cpu_device()), "cpu");
  std::unique_ptr<gpu::Device> opaque = gpu::make_opaque_cpu_device();
  EXPECT_EQ(device_kind(*opaque), "opaque");
}

TEST(CheckSameDevice, NamesTheFirstRankThatDiffersAndTheFirst) {
  auto rank = [](std::string host, std::string kind, std::string name) {
    return RankHello{
        .host = std::move(host), .device = std::move(kind), .device_name = std::move(name)};
  };
  EXPECT_TRUE(check_same_device({}).ok());
  EXPECT_TRUE(check_same_device({rank("a", "cuda", "cuda:0"), rank("b", "cuda", "cuda:1")}).ok());
  const absl::Status st = check_same_device(
      {rank("a", "cuda", "cuda:0"), rank("a", "cuda", "cuda:1"), rank("b", "cpu", "cpu")});
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("rank 0 on host a computes on cuda:0, rank 2 on host b computes "
                              "on cpu"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("the same --device"), std::string::npos) << st;
}

// CAF 0.17 packs doubles with a loop that never ends on an infinity (a
// diverged loss) and turns NaN into a number; they travel as their bits.
TEST_F(RemoteTest, DoublesAndFloatsArriveBitForBit) {
  const double values[] = {1.5,
                           -0.0,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::bit_cast<double>(std::uint64_t{0x7ff8dead0000beefULL}),  // a NaN
                           std::numeric_limits<double>::denorm_min(),
                           6.2505836877971888};
  for (double v : values) {
    Envelope e = round_trip(
        {.to = Target::kCoordinator, .content = caf::make_message(loss_atom::value, 3, 1, 2, v)});
    ASSERT_TRUE((e.content.match_elements<loss_atom, int, int, int, double>()))
        << to_string(e.content);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(e.content.get_as<double>(4)),
              std::bit_cast<std::uint64_t>(v));
    EXPECT_EQ(e.content.get_as<int>(2), 1);
  }
  const float inf = std::numeric_limits<float>::infinity();
  Envelope u = round_trip({.to = Target::kOptimizer,
                           .content = caf::make_message(update_atom::value, 4, 6e-4f, inf, 3)});
  ASSERT_TRUE((u.content.match_elements<update_atom, int, float, float, int>()));
  EXPECT_EQ(u.content.get_as<float>(2), 6e-4f);
  EXPECT_EQ(u.content.get_as<float>(3), inf);
  WaitReport r;
  r.rank = 2;
  r.since_s = std::numeric_limits<double>::infinity();
  r.progress = 99;
  Envelope w =
      round_trip({.to = Target::kReply, .actor = 0, .request = 7, .content = caf::make_message(r)});
  ASSERT_TRUE(w.content.match_elements<WaitReport>());
  EXPECT_EQ(w.content.get_as<WaitReport>(0).since_s, r.since_s);
  EXPECT_EQ(w.content.get_as<WaitReport>(0).progress, 99u);
  EXPECT_EQ(w.request, 7u);
}

// A byte vector's length is allocated before CAF 0.17 checks the bytes
// left: a 33-byte frame could claim 4 GiB. Such types never decode.
// troupe watch's feed carries --fp16's loss scale and skipped steps.
TEST(WatchFeed, AStepCarriesTheLossScaleAndTheSkip) {
  WatchEvent e;
  e.kind = WatchEvent::Kind::kStep;
  e.metrics.step = 4;
  e.metrics.loss = 2.5;
  e.metrics.loss_scale = 1024.0f;
  e.metrics.skipped = true;
  e.metrics.skipped_steps = 3;
  absl::StatusOr<WatchEvent> d = decode_watch_event(encode_watch_event(e));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->metrics.step, 4);
  EXPECT_EQ(d->metrics.loss_scale, 1024.0f);
  EXPECT_TRUE(d->metrics.skipped);
  EXPECT_EQ(d->metrics.skipped_steps, 3);
  e.metrics.skipped = false;
  d = decode_watch_event(encode_watch_event(e));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->metrics.skipped);
}

TEST_F(RemoteTest, FramesWithOtherTypesAreRefusedByTheirTypeNames) {
  const std::string bytes = encode_envelope(
      *sys_, {.to = Target::kCoordinator, .content = caf::make_message(std::vector<char>(3, 'x'))});
  absl::StatusOr<Envelope> e = decode_envelope(*sys_, bytes);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("'@charbuf'"), absl::string_view::npos) << e.status();
  // Lists of strings only where asked for (the world message to a rank).
  const std::string world = encode_envelope(
      *sys_,
      {.to = Target::kControl,
       .content = caf::make_message(remote_world_atom::value, std::vector<std::string>{"a", "b"})});
  EXPECT_FALSE(decode_envelope(*sys_, world).ok());
  EXPECT_TRUE(decode_envelope(*sys_, world, /*allow_string_lists=*/true).ok());
  EXPECT_FALSE(decode_envelope(*sys_, bytes.substr(0, 5)).ok());
  EXPECT_FALSE(decode_envelope(*sys_, bytes + "x").ok());
}

// A rank with the token that names another replica's micro-batch (the
// coordinator indexed an array with it) is cut off, and the run ends with
// an error naming it; nothing else happens.
TEST_F(RemoteTest, ARankThatSendsWhatItMayNotIsCutOff) {
  const CoordinatorHostOptions o = two_stage_host();
  auto host = CoordinatorHost::listen(o);
  ASSERT_TRUE(host.ok()) << host.status();
  auto ran = std::async(std::launch::async, [&] { return (*host)->run(nullptr); });
  auto link = comm::ControlLink::connect(
      "127.0.0.1", (*host)->port(), 1,
      encode_hello(*sys_, {.host = "h", .pid = 1, .transport_address = "x"}), {.token = o.token},
      [](std::string) {}, [](absl::Status) {});
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)
                  ->send(encode_envelope(*sys_, {.to = Target::kCoordinator,
                                                 .content = caf::make_message(loss_atom::value, 1,
                                                                              100000000, 0, 1.0)}))
                  .ok());
  ASSERT_EQ(ran.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const absl::Status st = ran.get();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rank 1 (d=0 s=1 t=0) on host h"), absl::string_view::npos) << st;
  EXPECT_NE(st.message().find("a message it may not send"), absl::string_view::npos) << st;
}

// A rank that reports a failure may have seen a peer die (a copy from it
// failing with ESRCH): the peer's loss, heard just after, is named first,
// with the report after it; a report with no loss after it, or with only
// the reporter's own, stands alone.
class BlameTest : public RemoteTest {
 protected:
  // Both ranks join; rank 0 reports `what`; then rank `lose` (-1: none) is gone.
  absl::Status run(const std::string& what, int lose) {
    auto host = CoordinatorHost::listen(o_);
    EXPECT_TRUE(host.ok()) << host.status();
    if (!host.ok()) return host.status();
    std::promise<void> joined;  // (a rank that joins after the report is refused)
    auto ran = std::async(std::launch::async, [&] {
      return (*host)->run(nullptr,
                          [&](const std::vector<CoordinatorHost::Member>&) { joined.set_value(); });
    });
    std::vector<std::unique_ptr<comm::ControlLink>> links;
    std::promise<void> told;  // a rank still there has heard the end (then they leave)
    std::atomic<bool> once{false};
    const int listener = lose == 0 ? 1 : 0;
    for (int r = 0; r < 2; r++) {
      auto on_frame = [&, r](std::string frame) {
        absl::StatusOr<Envelope> e = decode_envelope(*sys_, frame);
        if (r == listener && e.ok() && e->content.match_element<remote_end_atom>(0) &&
            !once.exchange(true))
          told.set_value();
      };
      auto link = comm::ControlLink::connect(
          "127.0.0.1", (*host)->port(), r,
          encode_hello(*sys_,
                       {.host = "h", .pid = 10 + r, .transport_address = absl::StrCat("x", r)}),
          {.token = o_.token}, on_frame, [](absl::Status) {});
      EXPECT_TRUE(link.ok()) << link.status();
      if (!link.ok()) return link.status();
      links.push_back(*std::move(link));
    }
    EXPECT_EQ(joined.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_TRUE(links[0]
                    ->send(encode_envelope(
                        *sys_, {.to = Target::kControl,
                                .content = caf::make_message(failed_atom::value, 0, what)}))
                    .ok());
    if (lose >= 0) {  // (after the report has ended the run: as a copy's ESRCH comes first)
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      links[static_cast<std::size_t>(lose)].reset();
    }
    // The ranks leave once told (so the host does not wait its 30 s for them).
    EXPECT_EQ(told.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
    links.clear();
    EXPECT_EQ(ran.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    return ran.get();
  }
  CoordinatorHostOptions o_ = two_stage_host();
};

TEST_F(BlameTest, APeersLossHeardAfterItsReportIsTheCause) {
  o_.blame_grace = absl::Seconds(10);  // (ends when the loss comes)
  const absl::Status st = run("copy from rank 1 failed: No such process", /*lose=*/1);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;  // (a loss: a restart may help)
  EXPECT_TRUE(
      absl::StartsWith(st.message(), "rank 1 (d=0 s=1 t=0) on host h, pid 11: lost contact"))
      << st;
  EXPECT_TRUE(absl::StrContains(st.message(),
                                "; before that, rank 0 (d=0 s=0 t=0) on host h, pid 10: copy from "
                                "rank 1 failed: No such process"))
      << st;
}

TEST_F(BlameTest, AReportWithNoLossAfterItStands) {
  const absl::Status st = run("the disk is full", /*lose=*/-1);
  EXPECT_EQ(st.message(), "rank 0 (d=0 s=0 t=0) on host h, pid 10: the disk is full") << st;
  EXPECT_EQ(st.ToString(), "INTERNAL: " + std::string(st.message()));  // (no payload left)
}

// A rank that could not get ready reports it and exits: its own loss is
// what it said (not a loss to restart for).
TEST_F(BlameTest, TheReportersOwnExitDoesNotReplaceItsReport) {
  o_.blame_grace = absl::Seconds(1);
  const absl::Status st = run("connecting its transport: refused", /*lose=*/0);
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_EQ(st.message(),
            "rank 0 (d=0 s=0 t=0) on host h, pid 10: connecting its transport: refused")
      << st;
}

// A worker process runs one CAF worker, and two only where its NCCL
// collectives would connect at their first call (the user's
// NCCL_RUNTIME_CONNECT other than 0): one of them waiting there must not
// hold the rank's other actor.
TEST(WorkerCafThreads, OneUnlessAnNcclCollectiveMayWaitOnItsActor) {
  EXPECT_EQ(worker_caf_threads(/*uses_nccl=*/false, nullptr), 1);
  EXPECT_EQ(worker_caf_threads(false, "1"), 1);  // (no NCCL: a CPU run, or pp only)
  EXPECT_EQ(worker_caf_threads(true, "0"), 1);   // troupe's default
  EXPECT_EQ(worker_caf_threads(true, "1"), 2);
  EXPECT_EQ(worker_caf_threads(true, "yes"), 2);  // (NCCL takes a bad value as its default, on)
}

}  // namespace
}  // namespace troupe::actors
