// A rank's pipeline links (actors/rank/pipeline_link.h): over the transport on
// the opaque device, through a two-member NCCL communicator each on CUDA.
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actors/rank/rank.h"
#include "comm/stream_channel.h"
#ifdef TROUPE_HAVE_NCCL
#include "comm/nccl_communicator.h"
#endif

namespace troupe::actors {

using comm::MessageKind;

#ifdef TROUPE_HAVE_NCCL
static_assert(kConnectIdBytes == comm::kNcclUniqueIdBytes);
#endif

absl::Status RankUnit::make_links(gpu::Device& dev) {
  const ParallelOptions& par = spec_.parallel;
  if (par.pp == 1 || dev.host_visible()) return absl::OkStatus();  // the transport reads them
  const bool cuda = dev.kind() == gpu::DeviceKind::kCuda;
#ifdef TROUPE_HAVE_NCCL
  if (cuda && !spec_.own_device) return absl::OkStatus();  // ranks sharing a GPU: host memory
#else
  if (cuda) return absl::OkStatus();  // no NCCL: host memory
#endif
  absl::StatusOr<std::unique_ptr<PipelineLinks>> links =
      PipelineLinks::create(dev, par.layout(), shape_, spec_.rank);
  if (!links.ok()) return links.status();
  links_ = *std::move(links);
  if (cuda) return absl::OkStatus();  // NCCL's channels: connect_links()
  // The opaque CPU device: in-order channels over the transport, one per
  // kind (each link's peer is a global rank). (zbv's turn, a rank's link to
  // itself, is a copy on the compute stream: PipelineLinks.)
  std::shared_ptr<comm::StreamPointToPoint> activations =
      comm::stream_channel(transport_.get(), MessageKind::kActivation);
  std::shared_ptr<comm::StreamPointToPoint> gradients =
      comm::stream_channel(transport_.get(), MessageKind::kGradient);
  for (const PipelineLinks::Key& k : links_->keys()) {
    const std::shared_ptr<comm::StreamPointToPoint>& ch =
        k.kind == MessageKind::kActivation ? activations : gradients;
    links_->set_channel(k, ch.get(), k.from == spec_.rank ? k.to : k.from, ch);
  }
  return absl::OkStatus();
}

absl::Status RankUnit::connect_links() {
  if (!links_) return absl::OkStatus();
  if (stream_->device().kind() == gpu::DeviceKind::kCuda) {
    if (absl::Status st = make_link_communicators(); !st.ok()) return st;
  }
  return links_->warm_up(stream_->device());
}

namespace {

// What the two ends of a link tell each other before NCCL's init: whether
// the sender could make NCCL's id, each end's GPU, and the id.
constexpr std::size_t kUuidAt = 1, kUuidBytes = 16, kIdAt = kUuidAt + kUuidBytes;
constexpr std::size_t kLinkHelloBytes = kIdAt + kConnectIdBytes;

}  // namespace

absl::Status RankUnit::make_link_communicators() {
#ifdef TROUPE_HAVE_NCCL
  static_assert(kUuidBytes == comm::kCudaUuidBytes);
  const std::vector<PipelineLinks::Key> keys = links_->keys();
  const int device = stream_->device().index();
  absl::StatusOr<std::string> uuid = comm::cuda_device_uuid(device);
  // Each end sends the other its hello, behind a byte that says whether it
  // could make it (a failure is then heard, not waited for); all are
  // posted at once, then waited for.
  std::vector<std::string> out(keys.size(), std::string(kLinkHelloBytes, '\0'));
  std::vector<std::string> in(keys.size(), std::string(kLinkHelloBytes, '\0'));
  std::vector<std::future<absl::Status>> done;
  absl::Status made = uuid.status();
  for (std::size_t i = 0; i < keys.size(); i++) {
    const PipelineLinks::Key& k = keys[i];
    const bool sender = k.from == spec_.rank;
    const int other = sender ? k.to : k.from;
    // (source, the link's kind, which end sends it: unique per link.)
    auto tag = [&](int source, bool from_sender) {
      return comm::make_tag({.source = static_cast<std::uint32_t>(source),
                             .group = comm::GroupKind::kChannel,
                             .kind = MessageKind::kControl,
                             .micro = static_cast<std::uint32_t>(k.kind),
                             .layer = from_sender ? 0u : 1u});
    };
    bool ok = uuid.ok();
    if (ok) out[i].replace(kUuidAt, kUuidBytes, *uuid);
    if (ok && sender) {
      absl::StatusOr<std::string> id = comm::nccl_unique_id();
      ok = id.ok();
      if (ok) {
        out[i].replace(kIdAt, kConnectIdBytes, *id);
      } else if (made.ok()) {
        made = id.status();
      }
    }
    out[i][0] = ok ? 1 : 0;
    for (int dir = 0; dir < 2; dir++) {
      auto promise = std::make_shared<std::promise<absl::Status>>();
      done.push_back(promise->get_future());
      auto finished = [promise](absl::Status st) { promise->set_value(std::move(st)); };
      if (dir == 0) {
        transport_->send(other, tag(spec_.rank, sender), out[i].data(), out[i].size(),
                         std::move(finished));
      } else {
        transport_->recv(other, tag(other, !sender), in[i].data(), in[i].size(),
                         std::move(finished));
      }
    }
  }
  absl::Status shared = absl::OkStatus();
  for (std::future<absl::Status>& f : done) {
    absl::Status st = f.get();  // (fail_pending ends them: fail_peer)
    if (shared.ok() && !st.ok()) shared = st;
  }
  if (!shared.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the pipeline links' hellos before NCCL's init: ", shared.message()));
  }
  if (!made.ok()) return made;
  // Every link checked before any init: a rank that refuses one has made no
  // communicator a peer would then wait in, and every end of a bad link
  // says so itself.
  for (std::size_t i = 0; i < keys.size(); i++) {
    const PipelineLinks::Key& k = keys[i];
    const bool sender = k.from == spec_.rank;
    const int other = sender ? k.to : k.from;
    if (in[i][0] != 1) {
      return absl::UnavailableError(
          absl::StrCat("rank ", other, " could not make its part of the pipeline link from rank ",
                       k.from, " to rank ", k.to, " (its error is in its log)"));
    }
    // Both ends see the same: a link whose ranks share a GPU is refused on
    // both, by the same words.
    if (in[i].compare(kUuidAt, kUuidBytes, out[i], kUuidAt, kUuidBytes) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the pipeline link from rank ", k.from, " to rank ", k.to,
          ": both ranks are on one GPU (", stream_->device().name(),
          "), and NCCL takes a GPU per member. Give each rank a GPU of its own (a host's "
          "workers take GPU LOCAL_RANK: --nproc-per-node at most its GPUs), or run --pp in one "
          "process (troupe train), whose ranks share the GPU through host memory"));
    }
  }
  for (std::size_t i = 0; i < keys.size(); i++) {
    const PipelineLinks::Key& k = keys[i];
    const bool sender = k.from == spec_.rank;
    const std::string id = (sender ? out[i] : in[i]).substr(kIdAt, kConnectIdBytes);
    const int member = sender ? 0 : 1;
    absl::StatusOr<std::unique_ptr<comm::NcclCommunicator>> nccl =
        comm::NcclCommunicator::create(id, member, 2, device, &connect_cancelled_);
    if (!nccl.ok()) {
      return absl::Status(
          nccl.status().code(),
          absl::StrCat("the NCCL communicator of the pipeline link from rank ", k.from, " to rank ",
                       k.to, " (", stream_->device().name(), "): ", nccl.status().message()));
    }
    // A peer that dies with a transfer in flight, where NCCL notices: the
    // link's stream and the compute stream (which waits for the link's
    // receives) fail, naming it. (Both outlive the communicator: it goes
    // first when the unit does.)
    (*nccl)->on_failure([compute = stream_.get(), link = links_->stream(k), k](absl::Status why) {
      const absl::Status failed = absl::UnavailableError(absl::StrCat(
          "pipeline link (NCCL) from rank ", k.from, " to rank ", k.to, ": ", why.message()));
      link->fail(failed);
      compute->fail(failed);
    });
    std::shared_ptr<comm::NcclCommunicator> owned = *std::move(nccl);
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      link_nccl_.push_back(owned.get());
    }
    links_->set_channel(k, owned.get(), 1 - member, owned);
    // A cancel after create()'s last look, before fail_pending could see it.
    if (connect_cancelled_) {
      const absl::Status why = absl::CancelledError("the job stopped while the ranks connected");
      owned->fail(why);
      return why;
    }
  }
  return absl::OkStatus();
#else
  return absl::InternalError("RankUnit::connect: CUDA pipeline links in a build without NCCL");
#endif
}

}  // namespace troupe::actors
