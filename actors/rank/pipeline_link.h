// The pipeline's activations and gradients device to device, on a device
// the host cannot read, instead of through host memory and the transport:
// a link per neighbour, direction and kind, each an in-order channel
// (comm::StreamPointToPoint: NCCL's ncclSend/ncclRecv on CUDA, one
// two-member communicator a link; over the transport on the opaque CPU
// device, for tests) used on a stream of its own.
//
// The order rule. A link carries its messages in the order the sender's
// schedule produces them, and the receiver takes them in the order its own
// schedule consumes them; the two are the same sequence for every schedule
// (tests/actors/schedule_test.cc, EveryLinkCarriesItsMessagesInTheOrderThey
// AreConsumed). So the ShardActor sends an output when it fires the op that
// makes it, and posts a receive when it fires the op that reads it: in
// schedule order, from its one thread.
//
// Streams and events. send(): the link's stream waits (an event) for the
// compute stream to have made the tensor, then sends it; `sent` runs behind
// it. recv(): the link's stream receives into the tensor, and the compute
// stream waits (an event, which the caller may query) for it before the op
// that reads it. The compute
// stream never blocks in a transfer, so a send waiting for its receiver
// holds up nothing but its link (no schedule's sends and receives need to be
// paired, as blocking calls on one stream would).
//
// A rank's link to itself (a V's turn: its last stage holds virtual stages
// pp - 1 and pp) has no channel and no stream: send() keeps the tensor and
// its callback in a FIFO, and recv() copies the oldest into its tensor on
// the compute stream and then runs the callback. The sender's slot stays
// held until then (its `sent`), so the tensor is unchanged when it is read:
// no staging buffer, one copy.
//
//   auto links = PipelineLinks::create(dev, layout, shape, rank);
//   for (const PipelineLinks::Key& k : links->keys()) links->set_channel(k, ch, peer, nullptr);
//   links->recv(MessageKind::kActivation, prev_rank, compute, input);   // before the forward
//   links->send(MessageKind::kActivation, next_rank, compute, output, [](absl::Status) {...});
#pragma once

#include <compare>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actors/partition.h"
#include "comm/collectives.h"
#include "comm/groups.h"
#include "comm/tag.h"
#include "gpu/device.h"

namespace troupe::actors {

class PipelineLinks {
 public:
  struct Key {
    comm::MessageKind kind = comm::MessageKind::kActivation;  // or kGradient
    int from = 0, to = 0;                                     // global ranks
    auto operator<=>(const Key&) const = default;
  };

  // The links of `rank` in `layout` for `shape`'s chunks (none with one
  // stage), each with a stream of `dev` (an error if one cannot be made).
  static absl::StatusOr<std::unique_ptr<PipelineLinks>> create(gpu::Device& dev,
                                                               const comm::Layout& layout,
                                                               const comm::Layout& shape, int rank);
  ~PipelineLinks();  // waits for the links' streams

  // This rank's links to other ranks, sorted (kind, from, to): the order in
  // which every rank makes their channels (a global order, so no two ranks
  // wait for each other's first). (A link to itself needs no channel.)
  std::vector<Key> keys() const;
  // Link `key`'s channel, `peer` the other end's index in it; `keep` (may
  // be null) owns it for the links' life.
  void set_channel(const Key& key, comm::StreamPointToPoint* channel, int peer,
                   std::shared_ptr<void> keep);
  // Link `key`'s stream (it outlives the channel's owner).
  gpu::Stream* stream(const Key& key) { return find(key).stream.get(); }
  // Each link's first transfer (one float), in the links' global order,
  // waited for: what a channel sets up lazily (NCCL's connections) is set
  // up here, before the actors run, and a link that cannot work fails here.
  absl::Status warm_up(gpu::Device& dev);

  // The next message of `kind` from rank `from` into `into`, on that link's
  // stream; `compute` waits for it. A failed transfer fails `compute` too.
  // Returns an event that completes with the receive (to ask, not to wait).
  std::shared_ptr<gpu::Event> recv(comm::MessageKind kind, int from, gpu::Stream& compute,
                                   const gpu::Tensor& into);
  // `what` to rank `to` once `compute` has made it; `sent` runs on a host
  // thread once the transfer is done, with the link stream's status.
  void send(comm::MessageKind kind, int to, gpu::Stream& compute, const gpu::Tensor& what,
            std::function<void(absl::Status)> sent);

  // Fails every link's stream with `why`.
  void fail(const absl::Status& why);
  // Waits for every link's stream.
  void synchronize();

 private:
  struct Link {
    Key key;
    std::unique_ptr<gpu::Stream> stream;
    std::unique_ptr<gpu::Event> event;
    comm::StreamPointToPoint* channel = nullptr;
    int peer = -1;
    std::shared_ptr<void> keep;
    // A link to itself: the messages sent and not yet received, oldest
    // first, with their `sent`.
    bool self = false;
    std::deque<std::pair<gpu::Tensor, std::function<void(absl::Status)>>> queued;
  };
  PipelineLinks() = default;
  Link& find(const Key& key);

  int rank_ = 0;
  std::vector<Link> links_;  // sorted by key
};

}  // namespace troupe::actors
