// --trace, --trace-steps, --trace-buffer, --flight-dir, --debug-op-cost.
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "actors/rank/timed_stage.h"
#include "api/flag_rules.h"

namespace troupe::api {

absl::Status finish_trace_flags(TrainFlags& f) {
  actors::TraceOptions& tr = f.trace;
  if (!f.trace_steps.empty()) {
    int a = 0, b = 0;
    char end = 0;
    if (std::sscanf(f.trace_steps.c_str(), "%d:%d%c", &a, &b, &end) != 2 || a < 1 || b < a) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--trace-steps ", f.trace_steps, ": expected A:B with 1 <= A <= B (steps A to B)"));
    }
    if (tr.dir.empty()) return absl::InvalidArgumentError("--trace-steps needs --trace DIR");
    tr.first_step = a;
    tr.last_step = b;
  }
  // (64 bytes an event: 2^24 is 1 GiB a rank.)
  if (f.trace_buffer < 0 || f.trace_buffer > (std::int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--trace-buffer ", f.trace_buffer, ": expected 1 to 16777216 events a rank (1 GiB)"));
  }
  tr.events = static_cast<std::size_t>(f.trace_buffer);
  if (!(f.op_jitter >= 0 && f.op_jitter < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--debug-op-jitter ", f.op_jitter, ": expected a fraction of each op's time in [0, 1)"));
  }
  if (f.op_jitter > 0 && f.op_cost.empty()) {
    return absl::InvalidArgumentError("--debug-op-jitter needs --debug-op-cost");
  }
  if (!f.op_cost.empty()) {
    absl::StatusOr<std::vector<actors::OpCost>> costs =
        actors::parse_op_costs(f.op_cost, "--debug-op-cost");
    if (!costs.ok()) return costs.status();
    if (costs->size() != 1 && static_cast<int>(costs->size()) != f.parallel.pp) {
      return absl::InvalidArgumentError(
          absl::StrCat("--debug-op-cost ", f.op_cost, ": ", costs->size(), " costs for --pp ",
                       f.parallel.pp, " stages (give one, or one per stage)"));
    }
    f.op_costs = {.stages = *std::move(costs), .jitter = f.op_jitter, .seed = 1};
  }
  for (std::string* dir : {&tr.dir, &tr.flight_dir}) {
    if (dir->empty()) continue;
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(*dir, ec);
    if (!ec) *dir = abs.lexically_normal().string();
  }
  if (!tr.dir.empty()) return make_writable_dir(tr.dir, "--trace");
  return absl::OkStatus();
}

actors::StageFactory stage_factory(const TrainFlags& f) {
  if (f.op_cost.empty()) return nullptr;
  return actors::timed_stage_factory(f.op_costs);
}

}  // namespace troupe::api
