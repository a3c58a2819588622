// A rank's pipeline links (actors/pipeline_link.h): over the transport on
// the opaque device, through a two-member NCCL communicator each on CUDA.
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actors/rank.h"
#include "comm/stream_channel.h"
#ifdef TROUPE_HAVE_NCCL
#include "comm/nccl_communicator.h"
#endif

namespace troupe::actors {

using comm::MessageKind;

void RankUnit::make_links(gpu::Device& dev) {
  const ParallelOptions& par = spec_.parallel;
  if (par.pp == 1 || dev.host_visible()) return;  // the transport reads the buffers themselves
  if (dev.kind() == gpu::DeviceKind::kCuda) {
#ifdef TROUPE_HAVE_NCCL
    if (!spec_.own_device) return;  // ranks sharing a GPU: through host memory
    links_ = PipelineLinks::create(dev, par.layout(), shape_, spec_.rank);  // channels: connect()
#endif
    return;
  }
  // The opaque CPU device: in-order channels over the transport, one per
  // kind (each link's peer is a global rank).
  links_ = PipelineLinks::create(dev, par.layout(), shape_, spec_.rank);
  std::shared_ptr<comm::StreamPointToPoint> activations =
      comm::stream_channel(transport_.get(), MessageKind::kActivation);
  std::shared_ptr<comm::StreamPointToPoint> gradients =
      comm::stream_channel(transport_.get(), MessageKind::kGradient);
  for (const PipelineLinks::Key& k : links_->keys()) {
    const std::shared_ptr<comm::StreamPointToPoint>& ch =
        k.kind == MessageKind::kActivation ? activations : gradients;
    links_->set_channel(k, ch.get(), k.from == spec_.rank ? k.to : k.from, ch);
  }
}

absl::Status RankUnit::connect_links() {
  if (!links_ || stream_->device().kind() != gpu::DeviceKind::kCuda) return absl::OkStatus();
#ifdef TROUPE_HAVE_NCCL
  const std::vector<PipelineLinks::Key> keys = links_->keys();
  // Each link's sender makes NCCL's id and sends it to the receiver, behind
  // a byte that says whether it could (the receiver then learns of the
  // failure instead of waiting). All are posted at once, then waited for.
  std::vector<std::string> msgs(keys.size(), std::string(1 + kConnectIdBytes, '\0'));
  std::vector<std::future<absl::Status>> done;
  absl::Status made = absl::OkStatus();
  for (std::size_t i = 0; i < keys.size(); i++) {
    const PipelineLinks::Key& k = keys[i];
    const comm::Tag tag = comm::make_tag({.source = static_cast<std::uint32_t>(k.from),
                                          .group = comm::GroupKind::kChannel,
                                          .kind = MessageKind::kControl,
                                          .micro = static_cast<std::uint32_t>(k.kind)});
    auto promise = std::make_shared<std::promise<absl::Status>>();
    done.push_back(promise->get_future());
    auto finished = [promise](absl::Status st) { promise->set_value(std::move(st)); };
    if (k.from == spec_.rank) {
      absl::StatusOr<std::string> id = comm::nccl_unique_id();
      if (id.ok()) {
        msgs[i].replace(1, kConnectIdBytes, *id);
        msgs[i][0] = 1;
      } else if (made.ok()) {
        made = id.status();
      }
      transport_->send(k.to, tag, msgs[i].data(), msgs[i].size(), std::move(finished));
    } else {
      transport_->recv(k.from, tag, msgs[i].data(), msgs[i].size(), std::move(finished));
    }
  }
  absl::Status shared = absl::OkStatus();
  for (std::future<absl::Status>& f : done) {
    absl::Status st = f.get();  // (fail_pending ends them: fail_peer)
    if (shared.ok() && !st.ok()) shared = st;
  }
  if (!shared.ok()) {
    return absl::UnavailableError(
        absl::StrCat("sharing NCCL's ids of the pipeline links: ", shared.message()));
  }
  if (!made.ok()) return made;
  const int device = stream_->device().index();
  for (std::size_t i = 0; i < keys.size(); i++) {
    const PipelineLinks::Key& k = keys[i];
    if (msgs[i][0] != 1) {
      return absl::UnavailableError(absl::StrCat("rank ", k.from,
                                                 " could not make NCCL's id of its link to rank ",
                                                 k.to, " (its error is in its log)"));
    }
    const int member = k.from == spec_.rank ? 0 : 1;
    absl::StatusOr<std::unique_ptr<comm::NcclCommunicator>> nccl =
        comm::NcclCommunicator::create(msgs[i].substr(1), member, 2, device, &connect_cancelled_);
    if (!nccl.ok()) {
      return absl::Status(
          nccl.status().code(),
          absl::StrCat("the NCCL communicator of the pipeline link from rank ", k.from, " to rank ",
                       k.to, " (", stream_->device().name(), "): ", nccl.status().message()));
    }
    // A peer that dies with a transfer in flight, where NCCL notices: the
    // compute stream (which waits for the link's receives) fails, naming it.
    (*nccl)->on_failure([this, k](absl::Status why) {
      const absl::Status failed = absl::UnavailableError(absl::StrCat(
          "pipeline link (NCCL) from rank ", k.from, " to rank ", k.to, ": ", why.message()));
      links_->fail(failed);
      stream_->fail(failed);
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
