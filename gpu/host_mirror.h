// A device tensor and the host memory through which host code (a transport,
// a checkpoint, the loss sum) reads and writes it.
//
// On a device the host can read (the CPU) the mirror is the tensor itself:
// host() is the device tensor and the copies do nothing, so the CPU path
// pays nothing. Elsewhere (CUDA, the opaque CPU device) host() is an
// empty_host tensor of the same shape (pinned on CUDA) that ops::copy fills
// and empties in stream order; the host touches it only once the stream is
// past the copy (an event, a synchronize, a message sent behind it).
//
//   gpu::HostMirror losses(gpt.acts(slot).losses);
//   losses.to_host(s);                           // behind the forward
//   ... once the stream is past it: losses.host().host<float>()[i]
//   gpu::HostMirror in(input);                   // a transport receives into
//   recv(in.host().host<float>(), ...);          //   in.host(), then
//   in.to_device(s);                             //   the op reads `input`
#pragma once

#include <cstdint>

#include "gpu/device.h"
#include "gpu/tensor.h"

namespace troupe::gpu {

class HostMirror {
 public:
  HostMirror() = default;
  // `device` must be contiguous.
  explicit HostMirror(const Tensor& device);

  bool defined() const { return device_.defined(); }
  // True when host() is memory of its own, which the copies fill.
  bool separate() const { return host_.storage != device_.storage; }
  const Tensor& device() const { return device_; }
  const Tensor& host() const { return host_; }
  template <typename T>
  T* host_data() const {
    return host_.host<T>();
  }

  // In stream order, elements [begin, begin + n) of the flat tensor (n < 0:
  // to the end): host = device, or device = host. Nothing when not separate().
  void to_host(Stream& s, std::int64_t begin = 0, std::int64_t n = -1) const;
  void to_device(Stream& s, std::int64_t begin = 0, std::int64_t n = -1) const;

 private:
  Tensor part(const Tensor& t, std::int64_t begin, std::int64_t n) const;

  Tensor device_, host_;
};

}  // namespace troupe::gpu
