// What the UCX transport's files share (ucx_transport.cc, ucx_progress.cc):
// not part of its interface.
#pragma once

#include <vector>

namespace troupe::comm::ucx_internal {

// Set while this thread is inside progress_once (running callbacks): a
// callback that polls must not try worker_mu_ again.
extern thread_local bool in_progress;
struct InProgress {
  InProgress() { in_progress = true; }
  ~InProgress() { in_progress = false; }
};

// Set while this thread posts its own operation from submit(): whatever
// completes meanwhile (UCX may complete requests inside a post) is left for
// the progress thread, never run inside the call that posted it.
extern thread_local bool posting_here;
struct PostingHere {
  PostingHere() { posting_here = true; }
  ~PostingHere() { posting_here = false; }
};

// The transports this thread drives (drive_begin .. drive_end, once per
// open scope): an operation it submits to one of them meanwhile is posted at
// its own next poll, so the progress thread need not be woken for it.
std::vector<const void*>& driving();
inline bool drives(const void* transport) {
  for (const void* t : driving())
    if (t == transport) return true;
  return false;
}

}  // namespace troupe::comm::ucx_internal
