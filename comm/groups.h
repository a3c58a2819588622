// Ranks and their (d, s, t) coordinates, and the groups a rank belongs to.
//
// Rank order as in Megatron: t fastest, then d, then s, so a tensor-parallel
// group is tp consecutive ranks (one node) and a pipeline stage is a block of
// dp*tp ranks:  rank = s*(dp*tp) + d*tp + t.
//
//   comm::Layout layout{.tp = 8, .pp = 35, .dp = 16};
//   comm::Coord c = layout.coord(rank);
//   std::vector<int> tp_peers = layout.tensor_group(rank);    // in t order
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace troupe::comm {

struct Coord {
  int d = 0, s = 0, t = 0;
  bool operator==(const Coord&) const = default;
};

struct Layout {
  int tp = 1, pp = 1, dp = 1;

  int world() const { return tp * pp * dp; }
  Coord coord(int rank) const;
  int rank(Coord c) const { return c.s * (dp * tp) + c.d * tp + c.t; }

  // Members of each group containing `rank`, in group order (the index of
  // a member is its t, s or d respectively).
  std::vector<int> tensor_group(int rank) const;
  std::vector<int> pipeline_group(int rank) const;
  std::vector<int> data_group(int rank) const;
  // The first and last stage of rank's pipeline (Megatron's embedding
  // group, which ties the input embedding and the LM head); one member when
  // pp == 1.
  std::vector<int> embedding_group(int rank) const;

  absl::Status validate() const;  // every size positive
  std::string describe() const;   // "tp=2 pp=4 dp=1 (8 ranks)"
};

}  // namespace troupe::comm
