// Marking stream work in a rank's trace (actors/diagnostics/trace_marks.h).
#include "actors/diagnostics/trace_marks.h"

#include <memory>

namespace troupe::actors {

namespace trace = comm::trace;

void mark_stream(RankTrace* rt, gpu::Stream& stream, const trace::Event& e,
                 const std::function<void()>& enqueue, bool set_current) {
  if (rt == nullptr || rt->recorder == nullptr) {
    enqueue();
    return;
  }
  const bool wanted = rt->recorder->wants(e.step);
  if (!wanted && !set_current) {
    enqueue();
    return;
  }
  // The handle travels from the opening callback to the closing one; both
  // run on the stream's thread, in order.
  auto handle = std::make_shared<trace::Recorder::Handle>(trace::Recorder::kNone);
  stream.host_callback([rt, handle, e, set_current, wanted] {
    if (wanted) *handle = rt->recorder->open(e);
    if (set_current) rt->current = e;
  });
  enqueue();
  stream.host_callback([rt, handle, set_current, &stream] {
    rt->recorder->close(*handle, !stream.status().ok());
    if (set_current) rt->current = trace::Event{};
  });
}

}  // namespace troupe::actors
