// The zero-bubble schedules' op lists (actors/schedule.h has what they are;
// make_schedule is the way in).
#pragma once

#include <vector>

#include "actors/schedule.h"

namespace troupe::actors {

// ZB-H1 (also zb-auto's starting order) for stage s of pp, m micro-batches.
std::vector<ScheduleOp> zbh1_schedule(int pp, int s, int m);
// ZB-V: chunk 0 is virtual stage s, chunk 1 virtual stage 2pp-1-s.
std::vector<ScheduleOp> zbv_schedule(int pp, int s, int m);

}  // namespace troupe::actors
