// Registration of the library's message types.
#include "actors/messages.h"

#include "absl/strings/str_format.h"

namespace troupe::actors {

std::string to_string(const WaitReport& r) {
  if (r.waiting.empty()) {
    return absl::StrFormat("rank %d %s: step %d, not waiting", r.rank, r.actor, r.step);
  }
  return absl::StrFormat("rank %d %s: step %d, %s%swaiting for %s for %.2f s", r.rank, r.actor,
                         r.step, r.op_id >= 0 ? absl::StrFormat("op %d ", r.op_id) : "",
                         r.op.empty() ? "" : r.op + ", ", r.waiting, r.since_s);
}

std::string exception_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
  }
  return "unknown exception";
}

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<WaitReport>("troupe::WaitReport");
  cfg.add_message_type<DoubleBits>("troupe::f64");
  cfg.add_message_type<FloatBits>("troupe::f32");
}

}  // namespace troupe::actors
