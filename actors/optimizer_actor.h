// OptimizerActor: the ZeRO-1 optimizer partitions of one rank (d, s).
//
// Partition d of each of the rank's model chunks owns the fp32 master copy
// and the Adam moments of 1/dp of the chunk's flat parameter buffer
// (actors/partition.h), so optimizer memory per rank falls as 1/dp. Per step:
//   1. begin_step: post the receives of the first contributions (replica
//      0's gradient pieces, replica 1's, ...; on the embedding chunk, then
//      the head chunk's shares of the tied wte), as many as the staging
//      window holds;
//   2. as each contribution is complete and the one before it added, add it
//      to the sum (replica order: fixed, so every run is bitwise the same)
//      and post the receives of the next one into its slot; when every
//      contribution is in, report the squared norm to the coordinator;
//   3. update (lr, clip scale): AdamW on the owned range, then send the new
//      parameters to every replica's shard (all-gather as messages). An
//      update that carries the next step passes its begin_step to the
//      shard first, which holds it until it has its new parameters; the
//      shard then begins this actor's next step while step k's sends may
//      still be in flight.
//
// On a device the host cannot read (OptimizerSetup::dp), the replicas'
// pieces go device to device instead: each replica's shard reduces every
// piece to its partition's owner on its compute stream when the piece's
// bucket is final (StreamCollectives::reduce_on, into sum(): the replicas in
// order from zeros on the CPU, NCCL's order on GPUs), and says so once its
// step's ops are all on the stream (dp_reduced_atom, behind the rank's
// reduced event, which this stream then waits for); after AdamW every
// replica's optimizer broadcasts each piece from its owner into its own
// shard's parameters, in the pieces' order, on this stream, zeroes its
// rank's gradients for the next step (they are read), records the params
// event (which the shard's next step waits for), and tells its shard once
// the stream is past them and its status is checked (dp_params_atom; a
// shard ready before would let the run end, or the next step begin, under
// them). Only the tied wte's shares (contributions k >= dp) and its new
// values still travel as messages through host memory. With dp 1
// (OptimizerSetup::dp_alone) the pieces take the same way on every device,
// as copies on the stream: a rank's gradients and parameters are not sent
// to itself, and this stream is the shard's compute stream (RankUnit), so
// the sums follow the step's last op and the next step's first op follows
// the update in one stream's order, with no event or thread between.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "actors/diagnostics/trace_marks.h"
#include "actors/optimizer_partition.h"
#include "actors/partition.h"
#include "actors/rank/stage_compute.h"
#include "comm/collectives.h"
#include "comm/groups.h"
#include "comm/transport.h"
#include "gpu/device.h"
#include "gpu/host_mirror.h"
#include "model/optimizer.h"

namespace troupe::actors {

struct OptimizerSetup {
  int rank = 0;
  comm::Coord coord;
  comm::Layout layout;
  comm::Layout shape;
  std::vector<Partition*> partitions;  // by chunk
  // By chunk: with the pieces on the device, whose gradients the optimizer
  // zeroes for the next step once the update has read them.
  std::vector<StageCompute*> chunks;
  gpu::Stream* stream = nullptr;
  comm::Transport* transport = nullptr;
  model::AdamWConfig adam;
  std::vector<GradPiece> grad_pieces;
  std::vector<ParamPiece> param_pieces;
  caf::actor coordinator;
  // Copies the rank's state for step's checkpoint and writes it into the
  // temporary directory behind (RankUnit::save); returns once copied.
  std::function<absl::Status(int step, const std::string& tmp_dir)> save;
  RankTrace* trace = nullptr;  // the rank's recorder (may be null)
  // The DP group's stream collectives where the pieces go device to device
  // (null: as messages), and the rank's events that order them.
  // `dp_alone`: dp 1, the same without a group: behind the reduced event
  // this stream sums the chunk's own gradients into the partitions (from
  // zeros, as the messages' sum: Partition::begin_sum, add), and the
  // broadcast of a piece is its copy into the shard's parameters.
  comm::StreamCollectives* dp = nullptr;
  bool dp_alone = false;
  gpu::Event* dp_reduced = nullptr;  // recorded by the shard
  gpu::Event* dp_params = nullptr;   // recorded here
};

class OptimizerActor : public caf::event_based_actor {
 public:
  OptimizerActor(caf::actor_config& cfg, OptimizerSetup setup);
  caf::behavior make_behavior() override;
  // The messages handled in one go as one gpu::StreamBatch: a run of ops
  // they enqueue onto the idle stream wakes its thread once.
  resume_result resume(caf::execution_unit* unit, std::size_t max_throughput) override {
    gpu::StreamBatch batch;
    return caf::event_based_actor::resume(unit, max_throughput);
  }

 private:
  // The ZeRO-1 pieces go device to device (a DP group's collectives, or dp 1).
  bool pieces_on_device() const { return setup_.dp != nullptr || setup_.dp_alone; }
  // One partition's sum in a step: the pieces of each contribution (the
  // same for every replica; fixed for the run), and how far it has got.
  struct Sum {
    std::vector<const GradPiece*> main, tied;  // pieces of a k < dp, of a k >= dp
    int contributions = 0;                     // dp, or 2 dp with tied pieces
    std::vector<int> arrived;                  // pieces arrived, by contribution
    int posted = 0, enqueued = 0, added = 0;   // contributions so far
  };
  void begin_step(int step);
  void post(int part, int k);
  void on_recv(int part, int k, const std::string& error);
  void enqueue_adds(int part);  // every complete contribution next in order
  void on_reduced_on_device();
  void on_added(int part, int k);
  void finish_sum(int part);
  void maybe_reduced();
  void broadcast_params();
  void on_reduced();
  // count: Adam's 1-based count of updates; 0 skips the step.
  void update(float lr, float grad_scale, int count);
  void on_stepped();
  void on_sent(const std::string& error);
  void fail(const std::string& what);
  comm::Tag tag(comm::MessageKind kind, int source, int chunk, int layer) const;
  comm::trace::Event stream_event(comm::trace::What what, int chunk, int contribution = -1) const;
  void trace_wait(comm::trace::What what);  // ends the open wait; opens `what` (kNone: none)
  int rank_of(int d, int s) const { return setup_.layout.rank({d, s, setup_.coord.t}); }

  OptimizerSetup setup_;
  std::vector<Sum> sums_;    // by partition (chunk)
  caf::actor_addr shard_;    // the rank's shard (weak: no cycle of handles)
  bool reduced_in_ = false;  // with dp: the step's reduces are waited for on the stream
  int reduced_early_ = -1;   // a step whose dp_reduced_atom came before its begin_step
  int step_ = 0;
  int sums_done_ = 0, sends_pending_ = 0;
  int sends_step_ = 0;  // the step whose parameter sends are pending
  bool failed_ = false;
  std::uint64_t progress_ = 0;  // pieces arrived, reductions and steps done, over the run
  std::string phase_ = "idle";
  std::chrono::steady_clock::time_point since_;
  comm::trace::Recorder::Handle trace_wait_ = comm::trace::Recorder::kNone;
};

}  // namespace troupe::actors
