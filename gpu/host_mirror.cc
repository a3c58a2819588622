// HostMirror: the device tensor itself, or a host copy moved by ops::copy.
#include "gpu/host_mirror.h"

#include "gpu/ops.h"

namespace troupe::gpu {

HostMirror::HostMirror(const Tensor& device) : device_(device) {
  host_ = device.host_readable() ? device
                                 : Tensor::empty_host(*device.device(), device.dtype, device.shape);
}

Tensor HostMirror::part(const Tensor& t, std::int64_t begin, std::int64_t n) const {
  return t.view(begin, {n < 0 ? t.numel() - begin : n});
}

void HostMirror::to_host(Stream& s, std::int64_t begin, std::int64_t n) const {
  if (separate()) ops::copy(s, part(host_, begin, n), part(device_, begin, n));
}

void HostMirror::to_device(Stream& s, std::int64_t begin, std::int64_t n) const {
  if (separate()) ops::copy(s, part(device_, begin, n), part(host_, begin, n));
}

}  // namespace troupe::gpu
