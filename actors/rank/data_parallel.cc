// Where a rank's ZeRO-1 pieces go device to device (a reduce to each piece's
// partition, a broadcast from it): with dp 1 on every device, as copies on
// the rank's own streams; with a data-parallel group on a device the host
// cannot read, through NCCL on CUDA and the Communicator on the opaque
// device. (A group on the CPU sends them as messages.)
#include <memory>

#include "actors/rank/connected_collectives.h"
#include "actors/rank/rank.h"
#include "comm/communicator.h"

namespace troupe::actors {

absl::Status RankUnit::make_data_parallel(gpu::Device& dev) {
  const ParallelOptions& par = spec_.parallel;
  if (par.dp == 1) {
    // On every device: a rank's own pieces are copies on its streams, not
    // messages to itself (with their host copies, on a GPU), so a step
    // wakes no thread for them.
    dp_alone_ = true;
    dp_reduced_ = dev.make_event();
    dp_params_ = dev.make_event();
    return absl::OkStatus();
  }
  if (dev.host_visible()) return absl::OkStatus();  // the transport reads them
  const bool cuda = dev.kind() == gpu::DeviceKind::kCuda;
#ifdef TROUPE_HAVE_NCCL
  if (cuda && !spec_.own_device) return absl::OkStatus();  // replicas sharing a GPU: host memory
#else
  if (cuda) return absl::OkStatus();  // no NCCL: host memory
#endif
  data_group_ = std::make_unique<comm::Communicator>(
      *transport_, par.layout().data_group(spec_.rank), comm::GroupKind::kData);
  dp_device_ = std::make_unique<ConnectedCollectives>("the data-parallel group");
  dp_reduced_ = dev.make_event();
  dp_params_ = dev.make_event();
  return absl::OkStatus();
}

}  // namespace troupe::actors
