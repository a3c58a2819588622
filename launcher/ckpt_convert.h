// Resharding a checkpoint offline (`troupe ckpt convert`): the new layout's
// ranks filled from the old checkpoint by the code --load runs
// (actors::checkpoint_pieces, Checkpoint::fill), written and committed as
// that layout's checkpoint.
//
//   RETURN_IF_ERROR(convert_checkpoint(*old, "ck2", {.tp = 1, .pp = 2, .dp = 2}));
#pragma once

#include <string>

#include "absl/status/status.h"
#include "actors/rank/rank.h"
#include "model/checkpoint.h"

namespace troupe::launcher {

// Writes `c` as `par`'s checkpoint of the same step into the save directory
// `to` (DIR2/iter_NNNNNNN and its tracker). InvalidArgument naming the flag
// when the layout does not fit the model or batch; AlreadyExists when `to`
// already holds that step (nothing is overwritten).
absl::Status convert_checkpoint(const model::ckpt::Checkpoint& c, const std::string& to,
                                const actors::ParallelOptions& par);

}  // namespace troupe::launcher
