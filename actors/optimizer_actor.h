// OptimizerActor: the ZeRO-1 optimizer partitions of one rank (d, s).
//
// Partition d of each of the rank's model chunks owns the fp32 master copy
// and the Adam moments of 1/dp of the chunk's flat parameter buffer
// (actors/partition.h), so optimizer memory per rank falls as 1/dp. Per step:
//   1. begin_step: post the receives of every replica's gradient pieces
//      (and, on the embedding chunk, the head chunk's share of the tied wte);
//   2. all arrived: sum the replicas in replica order (fixed, so every run
//      is bitwise the same), report the squared norm to the coordinator;
//   3. update (lr, clip scale): AdamW on the owned range, then send the new
//      parameters to every replica's shard (all-gather as messages).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <caf/all.hpp>

#include "actors/partition.h"
#include "actors/stage_compute.h"
#include "comm/groups.h"
#include "comm/transport.h"
#include "gpu/device.h"
#include "model/optimizer.h"

namespace troupe::actors {

// One chunk's partition: its range and its buffers (owned by the runtime).
class Partition {
 public:
  // Master copy initialised from `chunk`'s parameters (synchronously).
  // Replicated parameters (the same on every TP rank) count towards the
  // gradient norm on TP rank 0 only (count_replicated).
  Partition(const StageCompute& chunk, int dp, int d, bool count_replicated, gpu::Stream& stream);

  const StageCompute& chunk() const { return chunk_; }
  Range range() const { return range_; }
  std::int64_t tied() const { return tied_; }  // leading elements that are the tied wte
  // fp32 master, Adam m and v (what ZeRO-1 divides by dp).
  std::int64_t state_bytes() const { return 3 * range_.size() * 4; }

  // Receive buffers of replica r: its gradient of range(), and (embedding
  // chunk) the head chunk's wte gradient of the first tied() elements.
  float* grad_buffer(int r, bool tied_wte) const;
  const float* master() const { return master_.data<float>(); }

  // Sums the replicas' gradients and enqueues their squared norm.
  void reduce(gpu::Stream& s) const;
  double squared_norm() const;  // after reduce() has run
  void step(gpu::Stream& s, const model::AdamWConfig& adam, float lr, int step,
            float grad_scale) const;

 private:
  gpu::Tensor view(const gpu::Tensor& t, std::int64_t begin, std::int64_t n) const;

  const StageCompute& chunk_;
  Range range_;
  std::int64_t tied_ = 0;
  int dp_ = 1;
  gpu::Tensor master_, m_, v_, sum_, norm_;  // norm_: one f64 per counted range
  std::vector<Range> counted_;                // parts of range_ in the gradient norm
  gpu::Tensor staging_;  // (dp, range) then (dp, tied)
};

struct OptimizerSetup {
  int rank = 0;
  comm::Coord coord;
  comm::Layout layout;
  PipelineShape shape;
  std::vector<Partition*> partitions;  // by chunk
  gpu::Stream* stream = nullptr;
  comm::Transport* transport = nullptr;
  model::AdamWConfig adam;
  std::vector<GradPiece> grad_pieces;
  std::vector<ParamPiece> param_pieces;
  caf::actor coordinator;
};

class OptimizerActor : public caf::event_based_actor {
 public:
  OptimizerActor(caf::actor_config& cfg, OptimizerSetup setup);
  caf::behavior make_behavior() override;

 private:
  void begin_step(int step);
  void on_recv(const std::string& error);
  void on_reduced();
  void update(float lr, float grad_scale);
  void on_stepped();
  void on_sent(const std::string& error);
  void fail(const std::string& what);
  comm::Tag tag(comm::MessageKind kind, int source, int chunk, int layer) const;
  int rank_of(int d, int s) const { return setup_.layout.rank({d, s, setup_.coord.t}); }

  OptimizerSetup setup_;
  int step_ = 0;
  int expected_ = 0, arrived_ = 0, sends_pending_ = 0;
  bool failed_ = false;
  std::uint64_t progress_ = 0;  // pieces arrived, reductions and steps done, over the run
  std::string phase_ = "idle";
  std::chrono::steady_clock::time_point since_;
};

}  // namespace troupe::actors
