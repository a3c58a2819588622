// The reduce to one member: a ZeRO-1 partition's gradient pieces summed by
// their owner, in the replicas' order.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"

namespace troupe::comm {

// The root adds each member's buffer, in member order, into zeros: out =
// ((0 + in_0) + in_1) + ..., each member's slices pulled as it comes to
// them (the others' sends wait in the transport meanwhile). The others
// send and are done once the root has taken their bytes.
absl::Status Communicator::gather_reduce(const float* in, float* out, std::size_t n, int root,
                                         std::uint32_t op) {
  if (me_ != root) {
    return exchange(root, in, n, me_, nullptr, 0, Combine::kCopy, op, 0, -1);
  }
  std::vector<float> own;
  if (in == out) {  // in place: keep this member's own before the zeros go in
    own.assign(in, in + n);
    in = own.data();
  }
  std::memset(out, 0, n * sizeof(float));
  for (int j = 0; j < size(); j++) {
    if (j == me_) {
      for (std::size_t i = 0; i < n; i++) out[i] = in[i] + out[i];  // as exchange's add
      continue;
    }
    absl::Status st = exchange(me_, nullptr, 0, j, out, n, Combine::kAdd, op, 0, -1);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

Communicator::Body Communicator::reduce_body(const float* in, float* out, std::size_t n, int root) {
  return [this, in, out, n, root]() -> absl::Status {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce: root ", root, " of ", size(), " members"));
    }
    if (n == 0) return absl::OkStatus();
    return gather_reduce(in, out, n, root, next_op_);
  };
}

void Communicator::reduce(const float* in, float* out, std::size_t n, int root, Callback done) {
  enqueue(reduce_body(in, out, n, root), std::move(done));
}

absl::Status Communicator::reduce_sync(const float* in, float* out, std::size_t n, int root) {
  return run_now(reduce_body(in, out, n, root));
}

}  // namespace troupe::comm
