// Ranks and their (d, s, t) coordinates, and the groups a rank belongs to.
//
// Rank order as in Megatron: t fastest, then d, then s, so a tensor-parallel
// group is tp consecutive ranks (one node) and a pipeline stage is a block of
// dp*tp ranks:  rank = s*(dp*tp) + d*tp + t.
//
// The one parallel layout of a job: everything that asks how many ranks,
// which (d, s, t) a rank is, which chunks a stage holds or how many
// micro-batches a step has asks a Layout (actors::ParallelOptions is one,
// with how to run it).
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
  int virtual_stages = 1;  // model chunks per pipeline stage (interleaved schedules)
  // ZB-V's placement (virtual_stages = 2): stage s holds chunks s and
  // 2pp-1-s, so the first stage holds the embedding and the head.
  bool v_shape = false;

  int world() const { return tp * pp * dp; }
  // Model chunks in the pipeline; chunk c of stage s is virtual stage
  // c * pp + s (Megatron's interleaving: stage s holds s, s + pp, ...), or
  // in a V, s for c = 0 and 2pp-1-s for c = 1.
  int chunks() const { return pp * virtual_stages; }
  int stage_of(int vs) const { return v_shape && vs >= pp ? 2 * pp - 1 - vs : vs % pp; }
  int chunk_of(int vs) const { return vs / pp; }
  int virtual_stage(int s, int c) const { return v_shape && c == 1 ? 2 * pp - 1 - s : c * pp + s; }
  // Micro-batches per replica and step: a global batch over dp replicas
  // of micro_batch samples each (the layout's validation checks it divides).
  int micro_batches(int global_batch, int micro_batch) const {
    return global_batch / (micro_batch * dp);
  }
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
  bool operator==(const Layout&) const = default;
};

}  // namespace troupe::comm
