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
//      parameters to every replica's shard (all-gather as messages).
//
// On a device the host cannot read (OptimizerSetup::dp), the replicas'
// pieces go device to device instead: each replica's shard reduces every
// piece to its partition's owner on its compute stream when the piece's
// bucket is final (StreamCollectives::reduce_on, into sum(): the replicas in
// order from zeros on the CPU, NCCL's order on GPUs), and says so once its
// step's ops are all on the stream (dp_reduced_atom, behind the rank's
// reduced event, which this stream then waits for); after AdamW every
// replica's optimizer broadcasts each piece from its owner into its own
// shard's parameters, in the pieces' order, on this stream, records the
// params event, and tells its shard once the stream is past them and its
// status is checked (dp_params_atom; a shard ready before would let the
// run end, or the next step begin, under them). Only the tied wte's
// shares (contributions k >= dp) and its new values still travel as
// messages through host memory.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "actors/diagnostics/trace_marks.h"
#include "actors/partition.h"
#include "actors/rank/stage_compute.h"
#include "comm/collectives.h"
#include "comm/groups.h"
#include "comm/transport.h"
#include "gpu/device.h"
#include "gpu/host_mirror.h"
#include "model/optimizer.h"

namespace troupe::actors {

// One chunk's partition: its range and its buffers (owned by the runtime).
//
// The replicas' gradients are summed in a fixed order of contributions:
// k < dp is replica k's gradient of range(); k >= dp (an embedding chunk
// whose tied head is another chunk's) is replica k - dp's share of the
// head's wte gradient, added to the first tied() elements. That is
//   sum = 0 + g_0 + g_1 + ... + g_{dp-1} (+ w_0 + ... + w_{dp-1} on the wte)
// element by element, one axpy per contribution, so every run (and any
// window) gives the same bits. Contributions are received into window()
// slots of range() elements, contribution k into slot k % window(): the
// receive of k + window() is posted once k has been added, so staging is
// O(range) and the optimizer side of a rank falls as 1/dp.
//
// What the host touches is in host memory (gpu/host_mirror.h): the slots
// the transport receives into (copied to the device in front of their add),
// the norms (copied back by end_sum), the new parameters the transport
// sends (copied back by step). On the CPU these are the buffers themselves.
class Partition {
 public:
  // Master copy initialised from `chunk`'s parameters (synchronously).
  // Replicated parameters (the same on every TP rank) count towards the
  // gradient norm on TP rank 0 only (count_replicated).
  // Mixed precision (`precision` not fp32): the shards get the master
  // rounded to it (compute()).
  Partition(const StageCompute& chunk, int dp, int d, bool count_replicated, gpu::Stream& stream,
            gpu::Precision precision = gpu::Precision::kFp32);

  const StageCompute& chunk() const { return chunk_; }
  Range range() const { return range_; }
  std::int64_t tied() const { return tied_; }  // leading elements that are the tied wte
  // fp32 master, Adam m and v (what ZeRO-1 divides by dp).
  std::int64_t state_bytes() const { return 3 * range_.size() * 4; }

  // Slots of the staging window (2 when there are several contributions to
  // overlap, 1 for dp = 1) and where contribution k is received: a buffer
  // of range() elements, piece p at p.range.begin - range().begin.
  int window() const { return window_; }
  float* slot(int k) const;  // host memory
  // In stream order: sum = 0; sum += contribution k (k = 0, 1, ... in
  // order); the squared norm of the sum.
  void begin_sum(gpu::Stream& s) const;
  void add(gpu::Stream& s, int k) const;
  void end_sum(gpu::Stream& s) const;
  double squared_norm() const;  // after end_sum() has run
  // AdamW on the master (update: Adam's 1-based count; 0 skips it), then
  // the compute copy rounded from the master, and its copy for the host.
  void step(gpu::Stream& s, const model::AdamWConfig& adam, float lr, int update,
            float grad_scale) const;
  // What the shards compute with, in host memory for the transport: the
  // master, or (mixed precision) it rounded, once step() has run. With the
  // replicas' pieces on the device (set_pieces_on_device), only its first
  // tied() elements are copied (the tied wte's, which still travel so).
  const float* compute() const { return send_.host_data<float>(); }
  // The same on the device, and the sum (range().size() elements each).
  const gpu::Tensor& compute_on_device() const { return compute_.defined() ? compute_ : master_; }
  const gpu::Tensor& sum() const { return sum_; }
  // The replicas' gradient pieces are reduced into sum() on the device by
  // the shards' streams (every element of range() a piece covers; the
  // rest, a head chunk's padding after its wte, stays the zeros it was
  // made with), so begin_sum() leaves it alone, and contributions k < dp
  // are not received; the new parameters are broadcast from
  // compute_on_device().
  void set_pieces_on_device() { pieces_on_device_ = true; }
  bool pieces_on_device() const { return pieces_on_device_; }
  // The state as a checkpoint holds it (device tensors of at least
  // range().size() floats).
  const gpu::Tensor& master() const { return master_; }
  const gpu::Tensor& adam_m() const { return m_; }
  const gpu::Tensor& adam_v() const { return v_; }

 private:
  gpu::Tensor view(const gpu::Tensor& t, std::int64_t begin, std::int64_t n) const;
  void adam(gpu::Stream& s, const model::AdamWConfig& adam, float lr, int update,
            float grad_scale) const;

  const StageCompute& chunk_;
  Range range_;
  std::int64_t tied_ = 0;
  int dp_ = 1;
  int window_ = 1;
  gpu::Precision precision_ = gpu::Precision::kFp32;
  bool pieces_on_device_ = false;
  gpu::Tensor master_, m_, v_, sum_, norm_;  // norm_: one f64 per counted range
  gpu::Tensor compute_;                      // mixed precision: the master rounded
  std::vector<Range> counted_;               // parts of range_ in the gradient norm
  gpu::Tensor staging_;  // (window, max(range, 1)): contribution k in slot k % window
  gpu::HostMirror staging_host_, norm_host_, send_;  // send_: of compute_ or the master
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
  // Copies the rank's state for step's checkpoint and writes it into the
  // temporary directory behind (RankUnit::save); returns once copied.
  std::function<absl::Status(int step, const std::string& tmp_dir)> save;
  RankTrace* trace = nullptr;  // the rank's recorder (may be null)
  // The DP group's stream collectives where the pieces go device to device
  // (null: as messages), and the rank's events that order them.
  comm::StreamCollectives* dp = nullptr;
  gpu::Event* dp_reduced = nullptr;  // recorded by the shard
  gpu::Event* dp_params = nullptr;   // recorded here
};

class OptimizerActor : public caf::event_based_actor {
 public:
  OptimizerActor(caf::actor_config& cfg, OptimizerSetup setup);
  caf::behavior make_behavior() override;

 private:
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
  caf::actor_addr shard_;    // the rank's shard (with dp; weak: no cycle of handles)
  bool reduced_in_ = false;  // with dp: the step's reduces are waited for on the stream
  int reduced_early_ = -1;   // a step whose dp_reduced_atom came before its begin_step
  int step_ = 0;
  int sums_done_ = 0, sends_pending_ = 0;
  bool failed_ = false;
  std::uint64_t progress_ = 0;  // pieces arrived, reductions and steps done, over the run
  std::string phase_ = "idle";
  std::chrono::steady_clock::time_point since_;
  comm::trace::Recorder::Handle trace_wait_ = comm::trace::Recorder::kNone;
};

}  // namespace troupe::actors
