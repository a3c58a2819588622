// Actors of one run in several processes: the control messages between the
// coordinator and the ranks' actors travel as frames of troupe's control
// channel (comm/control_channel.h), each one CAF message serialized with
// CAF's binary serializer, and are delivered to stand-ins, so that every
// actor keeps talking to handles as it does in one process:
//
//   coordinator's process                     worker process of rank r
//   Coordinator --> RemoteActor(r, shard) ==frame==> ShardActor
//               <-- (loss, norm, ready) <==frame== CoordinatorStandIn <-- ShardActor
//
// A RemoteActor (remote_actor.h) stands for one actor of a remote rank:
// what it is sent goes out as a frame (a request keeps its response promise until the answer's
// frame comes back); when the rank's connection is lost it quits with the
// reason, so whoever monitors it (the coordinator) sees it stop. A
// CoordinatorStandIn (coordinator_stand_in.h) sends everything it is sent
// to the coordinator; a RequestRelay (request_relay.h) answers the
// coordinator's requests from a worker's actors.
// CAF's own network layer (BASP) is not used: its handshake runs before any
// check of ours, and its payload length is unbounded.
//
// Tensors never travel here; they go by the rank's transport (UCX).
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu/device.h"

namespace troupe::actors {

// Who a frame is for.
enum class Target : std::uint8_t {
  kShard = 0,        // the rank's ShardActor
  kOptimizer = 1,    // the rank's OptimizerActor
  kCoordinator = 2,  // the coordinator (from a rank's actors)
  kReply = 3,        // the answer to request `request` made of `actor`
  kControl = 4,      // the run itself: world, start, end (actors/runtime/worker.h)
};

struct Envelope {
  Target to = Target::kControl;
  std::uint8_t actor = 0;     // kReply: Target of the actor that answers
  std::uint64_t request = 0;  // 0: no answer wanted
  caf::message content;
};

// The frame of an envelope, and back: InvalidArgument for a frame that is
// not one (unknown target, trailing bytes, a type outside troupe's control
// messages). The message's type names are read and checked before any of
// its values: CAF 0.17 sizes a sequence before it checks the bytes left, so
// a 33-byte frame claiming a std::vector<char> of 4 GiB would allocate it.
// Only scalars, strings and WaitReports are accepted, and lists of strings
// with `allow_string_lists` (the coordinator's world message to a rank).
std::string encode_envelope(caf::actor_system& system, const Envelope& e);
absl::StatusOr<Envelope> decode_envelope(caf::actor_system& system, absl::string_view frame,
                                         bool allow_string_lists = false);

// Sends one frame; an error means the peer is gone.
using FrameSink = std::function<absl::Status(std::string frame)>;

using remote_reply_atom = caf::atom_constant<caf::atom("rreply")>;
using remote_lost_atom = caf::atom_constant<caf::atom("rlost")>;

// The run's own frames (Target::kControl):
//   coordinator -> rank  (remote_world_atom, vector<string> transport addresses by rank)
//                        (remote_end_atom, int status code, std::string message)
//                        (remote_bye_atom)   every rank is done: tear down
//   rank -> coordinator  (remote_ready_atom, int rank)   its actors are up, its transport connected
//                        (remote_done_atom, int rank)    it has stopped (and sent its weights)
//                        (failed_atom, int rank, std::string why)   it cannot get ready
// The done/bye barrier keeps every rank's transport up until no rank needs
// it (a sender's last message waits for the receiver's acknowledgement).
using remote_world_atom = caf::atom_constant<caf::atom("rworld")>;
using remote_ready_atom = caf::atom_constant<caf::atom("rready")>;
using remote_end_atom = caf::atom_constant<caf::atom("rend")>;
using remote_done_atom = caf::atom_constant<caf::atom("rdone")>;
using remote_bye_atom = caf::atom_constant<caf::atom("rbye")>;
// Tracing (actors/diagnostics/trace_file.h):
//   rank -> coordinator  (remote_clock_atom, int rank, int64 t0)   a probe: the rank's steady clock
//   coordinator -> rank  (remote_clock_atom, int64 t0, int64 tc)  the answer: the coordinator's
//                        (remote_trace_atom, std::string reason)  write your trace now (SIGUSR1)
using remote_clock_atom = caf::atom_constant<caf::atom("rclock")>;
using remote_trace_atom = caf::atom_constant<caf::atom("rtrace")>;

// What a rank says when it joins (the control channel's hello).
struct RankHello {
  std::string host = {};  // gethostname()
  std::int32_t pid = 0;
  std::string transport_address = {};  // UcxTransport::address()
  bool has_valid = false;              // it has validation data (--eval-interval)
  std::string train_data = {};         // SampleSource::describe(), for the launcher's banner
  // Its device: the kind ("cpu", "opaque", "cuda"; every rank's must be the
  // same, as the links and collectives take their path by it) and its name.
  std::string device = {}, device_name = {};
};
// A rank's RankHello::device kind.
std::string device_kind(const gpu::Device& d);
// InvalidArgument naming two ranks whose device kinds differ, else OK.
absl::Status check_same_device(const std::vector<RankHello>& ranks);
std::string encode_hello(caf::actor_system& system, const RankHello& h);
absl::StatusOr<RankHello> decode_hello(caf::actor_system& system, absl::string_view bytes);

using remote_request_atom = caf::atom_constant<caf::atom("rrequest")>;

}  // namespace troupe::actors
