// Communicator's collectives as callers see them: which algorithm each one
// runs (by message size and member count; the algorithms are in
// communicator.cc), each as a phase the trace records, queued on the
// group's worker or run on the caller's thread.
#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"

namespace troupe::comm {

// Runs one phase of collective `op`, recorded as a phase event when a
// recorder is set.
absl::Status Communicator::phase(trace::What what, std::uint32_t op, std::size_t n,
                                 const std::function<absl::Status()>& run) {
  if (recorder_ == nullptr) return run();
  trace::Event e;
  e.kind = trace::Kind::kPhase;
  e.what = what;
  e.seq = static_cast<std::int32_t>(op);
  e.bytes = static_cast<std::int64_t>(n * sizeof(float));
  e.step = recorder_step_.load(std::memory_order_relaxed);
  e.begin_ns = trace::now_ns();
  absl::Status st = run();
  e.end_ns = trace::now_ns();
  e.failed = st.ok() ? 0 : 1;
  recorder_->record(e);
  return st;
}

SumOrder Communicator::sum_order(std::size_t n) const {
  if (n * sizeof(float) <= options_.direct_max_bytes) return SumOrder::kMembers;
  if (std::has_single_bit(static_cast<unsigned>(size())) &&
      n * sizeof(float) <= options_.halving_max_bytes) {
    return SumOrder::kHalving;
  }
  return SumOrder::kRing;
}

Communicator::Body Communicator::all_reduce_body(float* data, std::size_t n) {
  return [this, data, n]() -> absl::Status {
    const std::uint32_t op = next_op_;
    if (size() == 1 || n == 0) return absl::OkStatus();
    using trace::What;
    absl::StatusOr<bool> shm = shm_ready(op);
    if (!shm.ok()) return shm.status();
    if (*shm) return phase(What::kSharedMemory, op, n, [&] { return shm_all_reduce(data, n, op); });
    set_route(n);
    switch (sum_order(n)) {
      case SumOrder::kMembers:
        return phase(What::kDirect, op, n, [&] { return direct_all_reduce(data, n, op); });
      case SumOrder::kHalving: {
        absl::Status st =
            phase(What::kReduceScatter, op, n, [&] { return halving_reduce_scatter(data, n, op); });
        if (!st.ok()) return st;
        return phase(What::kAllGather, op, n, [&] {
          return doubling_all_gather(
              data, n, op,
              static_cast<std::uint32_t>(std::countr_zero(static_cast<unsigned>(size()))));
        });
      }
      case SumOrder::kRing:
        break;
    }
    absl::Status st =
        phase(What::kReduceScatter, op, n, [&] { return ring_reduce_scatter(data, n, op); });
    if (!st.ok()) return st;
    return phase(What::kAllGather, op, n, [&] {
      return ring_all_gather(data, n, op, static_cast<std::uint32_t>(size() - 1));
    });
  };
}

Communicator::Body Communicator::reduce_scatter_body(const float* in, float* out, std::size_t n) {
  return [this, in, out, n]() -> absl::Status {
    auto [b, e] = chunk_range(n, size(), me_);
    if (size() == 1) {
      std::copy(in + b, in + e, out);
      return absl::OkStatus();
    }
    std::vector<float> work(in, in + n);
    absl::Status st = ring_reduce_scatter(work.data(), n, next_op_);
    if (!st.ok()) fail(st);                                    // cancels the sends still in flight
    if (absl::Status sent = wait_sends(); st.ok()) st = sent;  // they read `work`
    if (st.ok())
      std::copy(work.begin() + static_cast<std::ptrdiff_t>(b),
                work.begin() + static_cast<std::ptrdiff_t>(e), out);
    return st;
  };
}

Communicator::Body Communicator::all_gather_body(const float* in, float* out, std::size_t n) {
  return [this, in, out, n]() -> absl::Status {
    auto [b, e] = chunk_range(n, size(), me_);
    std::copy(in, in + (e - b), out + b);
    if (size() == 1) return absl::OkStatus();
    const std::uint32_t op = next_op_;
    return phase(trace::What::kAllGather, op, n, [&] { return ring_all_gather(out, n, op, 0); });
  };
}

Communicator::Body Communicator::broadcast_body(float* data, std::size_t n, int root) {
  return [this, data, n, root]() -> absl::Status {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast: root ", root, " of ", size(), " members"));
    }
    if (size() == 1 || n == 0) return absl::OkStatus();
    return chain_broadcast(data, n, root, next_op_);
  };
}

void Communicator::all_reduce(float* data, std::size_t n, Callback done) {
  enqueue(all_reduce_body(data, n), std::move(done));
}
void Communicator::reduce_scatter(const float* in, float* out, std::size_t n, Callback done) {
  enqueue(reduce_scatter_body(in, out, n), std::move(done));
}
void Communicator::all_gather(const float* in, float* out, std::size_t n, Callback done) {
  enqueue(all_gather_body(in, out, n), std::move(done));
}
void Communicator::broadcast(float* data, std::size_t n, int root, Callback done) {
  enqueue(broadcast_body(data, n, root), std::move(done));
}

absl::Status Communicator::all_reduce_sync(float* data, std::size_t n) {
  return run_now(all_reduce_body(data, n));
}
absl::Status Communicator::reduce_scatter_sync(const float* in, float* out, std::size_t n) {
  return run_now(reduce_scatter_body(in, out, n));
}
absl::Status Communicator::all_gather_sync(const float* in, float* out, std::size_t n) {
  return run_now(all_gather_body(in, out, n));
}
absl::Status Communicator::broadcast_sync(float* data, std::size_t n, int root) {
  return run_now(broadcast_body(data, n, root));
}

// The bytes travel in floats that no one adds: copied, not converted.
absl::Status broadcast_bytes(Communicator& group, std::string* bytes, int root) {
  if (bytes->empty()) return absl::OkStatus();
  std::vector<float> buf((bytes->size() + sizeof(float) - 1) / sizeof(float), 0.0f);
  std::memcpy(buf.data(), bytes->data(), bytes->size());
  if (absl::Status st = group.broadcast_sync(buf.data(), buf.size(), root); !st.ok()) return st;
  std::memcpy(bytes->data(), buf.data(), bytes->size());
  return absl::OkStatus();
}

}  // namespace troupe::comm
