// Stream collectives that RankUnit::connect() makes (NCCL's communicator
// needs the peers, reachable only once the transport is connected), behind
// a forwarder the actors are given before: a call before then fails,
// naming the missing step.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/collectives.h"

namespace troupe::actors {

class ConnectedCollectives final : public comm::StreamCollectives {
 public:
  explicit ConnectedCollectives(std::string group) : group_(std::move(group)) {}
  void set(std::unique_ptr<comm::StreamCollectives> to) { to_ = std::move(to); }
  bool connected() const { return to_ != nullptr; }

  absl::Status all_reduce_on(void* stream, float* data, std::size_t n) override {
    if (!to_) return not_yet();
    return to_->all_reduce_on(stream, data, n);
  }
  absl::Status reduce_scatter_on(void* stream, const float* in, float* out,
                                 std::size_t n) override {
    if (!to_) return not_yet();
    return to_->reduce_scatter_on(stream, in, out, n);
  }
  absl::Status all_gather_on(void* stream, const float* in, float* out, std::size_t n) override {
    if (!to_) return not_yet();
    return to_->all_gather_on(stream, in, out, n);
  }
  absl::Status reduce_on(void* stream, const float* in, float* out, std::size_t n,
                         int root) override {
    if (!to_) return not_yet();
    return to_->reduce_on(stream, in, out, n, root);
  }
  absl::Status broadcast_on(void* stream, const void* in, void* out, std::size_t bytes,
                            int root) override {
    if (!to_) return not_yet();
    return to_->broadcast_on(stream, in, out, bytes, root);
  }

 private:
  absl::Status not_yet() const {
    return absl::FailedPreconditionError(absl::StrCat(
        "a collective of ", group_, " before RankUnit::connect() made its collectives"));
  }
  std::string group_;
  std::unique_ptr<comm::StreamCollectives> to_;
};

}  // namespace troupe::actors
