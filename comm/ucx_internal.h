// What the UCX transport's files share (ucx_transport.cc, ucx_progress.cc):
// not part of its interface.
#pragma once

namespace troupe::comm::ucx_internal {

// Set while this thread is inside progress_once (running callbacks): a
// callback that polls must not try worker_mu_ again.
extern thread_local bool in_progress;
struct InProgress {
  InProgress() { in_progress = true; }
  ~InProgress() { in_progress = false; }
};

}  // namespace troupe::comm::ucx_internal
