// Rank <-> (d, s, t) and group membership.
#include "comm/groups.h"

#include "absl/strings/str_cat.h"

namespace troupe::comm {

Coord Layout::coord(int rank) const {
  return {.d = (rank / tp) % dp, .s = rank / (dp * tp), .t = rank % tp};
}

std::vector<int> Layout::tensor_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int t = 0; t < tp; t++) g.push_back(rank({c.d, c.s, t}));
  return g;
}

std::vector<int> Layout::pipeline_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int s = 0; s < pp; s++) g.push_back(rank({c.d, s, c.t}));
  return g;
}

std::vector<int> Layout::data_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int d = 0; d < dp; d++) g.push_back(rank({d, c.s, c.t}));
  return g;
}

std::vector<int> Layout::embedding_group(int r) const {
  Coord c = coord(r);
  if (pp == 1) return {rank({c.d, 0, c.t})};
  return {rank({c.d, 0, c.t}), rank({c.d, pp - 1, c.t})};
}

absl::Status Layout::validate() const {
  if (tp < 1 || pp < 1 || dp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp, --pp and --dp must be positive (", describe(), ")"));
  }
  if (v_shape && virtual_stages != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a V placement holds 2 model chunks per stage, not ", virtual_stages, " (",
                     describe(), ")"));
  }
  return absl::OkStatus();
}

std::string Layout::describe() const {
  return absl::StrCat("tp=", tp, " pp=", pp, " dp=", dp, " (", world(), " ranks)");
}

}  // namespace troupe::comm
