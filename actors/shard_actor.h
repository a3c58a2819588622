// ShardActor: one pipeline stage of one data-parallel replica (rank (d, s)),
// with its model chunks (v of them when interleaved) and its compute stream.
//
// It walks its stage's schedule (actors/schedule.h). An op fires when the
// message carrying its input has arrived (or behind a gate, below): the
// micro-batch (read from the dataset on the chunks with the embedding or
// the head), the activation from the previous virtual stage, the gradient
// from the next one. Firing
// enqueues the op on the stream and moves on; the stream's completion comes
// back as a message, and outputs leave through comm/ without waiting. A
// micro-batch holds an activation slot from its forward until its backward
// and its outgoing messages are done. After a chunk's last backward of the
// step, each gradient bucket goes to the optimizer partitions as soon as the
// stream has finished it (overlapping the rest of the backward). When every
// parameter piece of the new step has come back, the shard reports ready.
//
// Zero-bubble schedules (actors/schedule.h) split the backward: B frees
// the slot and fills a weight stash, which its W frees (a stash is
// reusable as soon as its W is on the stream); the buckets leave behind a
// chunk's last W. zb-h1 and zbv fire W where their lists put it. zb-auto
// walks its list's forwards and B's the same way and fires W's itself, the
// oldest pending first, one piece (a layer's) at a time: when the stream
// has run dry and the next F or B's input is not there, when a B waits
// for a stash, and at the end of the list. A piece started just before an
// input arrives delays that input's op, so the rule uses what it measured
// in earlier steps: how long after the stream ran dry each op's input
// came, and how long a piece takes; a piece that would not end before the
// input is due waits, until the input comes or is overdue, unless the
// next B will find no free stash (a W must run before it anyway, and
// sooner delays less). The pieces' order per chunk is fixed, so the sums
// are 1F1B's bitwise.
//
// Buffers, stream and transport belong to the caller (actors/runtime/in_process.h) and
// outlive the actor; nothing here blocks a scheduler thread.
//
// On a device the host cannot read (CUDA), what the transport and the loss
// sum touch goes through host mirrors (gpu/host_mirror.h), copied on the
// stream: a received activation or gradient to the device in front of the
// op that reads it, an output to the host behind the op that made it (and
// sent once the stream is past the copy), a gradient bucket to the host
// when it is final, the new parameters to the device before the shard says
// ready. On the CPU the mirrors are the buffers themselves and cost nothing.
// With pipeline links (ShardSetup::links) activations and gradients go
// device to device instead: the receive is posted, on its link's stream,
// when the op that reads it fires (the compute stream waits for it there),
// the send when the op that makes it fires (its link's stream waits for
// the op), both in schedule order (the order rule of actors/rank/pipeline_link.h).
//
// Through the transport, an op whose input has not come fires all the same
// where the stream has gates (gpu::Stream::gate: the CPU's), behind a gate
// that the receive's completion opens: the arrival starts the op on the
// stream's thread without a hop through this actor's mailbox, which hears
// of it only by the op's completion (or the receive's error). zb-auto
// keeps the message: it fires W's into the time an input is missing.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "actors/diagnostics/trace_marks.h"
#include "actors/messages.h"
#include "actors/partition.h"
#include "actors/rank/pipeline_link.h"
#include "actors/rank/stage_compute.h"
#include "actors/schedule.h"
#include "comm/collectives.h"
#include "comm/groups.h"
#include "comm/transport.h"
#include "gpu/device.h"
#include "gpu/host_mirror.h"
#include "model/batch_schedule.h"
#include "model/data/gpt_dataset.h"

namespace troupe::actors {

class Partition;  // actors/optimizer_actor.h

// Testing: the shard(s) of stage `stage` throw at the begin of step `step`,
// or (kStall) ignore that step, as a hung rank would.
struct FailPoint {
  enum class Kind { kThrow, kStall };
  int stage = -1;
  int step = -1;
  Kind kind = Kind::kThrow;
};

struct ShardSetup {
  int rank = 0;
  comm::Coord coord;
  comm::Layout layout;
  comm::Layout shape;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int m = 1;                     // micro-batches per replica at the full global batch
  int B = 1, T = 1;              // micro-batch size, sequence length
  int global_batch = 1;          // sequences per step over all replicas (evaluation; the most)
  model::BatchSchedule batches;  // each training step's global batch (empty: global_batch)
  const model::data::SampleSource* data = nullptr;   // training samples
  const model::data::SampleSource* valid = nullptr;  // validation samples (may be null)
  std::vector<StageCompute*> chunks;  // chunk c: virtual stage layout.virtual_stage(s, c)
  gpu::Stream* stream = nullptr;
  comm::Transport* transport = nullptr;
  // Where activations and gradients go device to device (the links' own
  // streams and channels, actors/rank/pipeline_link.h); null: through host
  // mirrors and the transport.
  PipelineLinks* links = nullptr;
  std::vector<GradPiece> grad_pieces;    // of the whole model (this actor sends its own)
  std::vector<ParamPiece> param_pieces;  // of the whole model (this actor receives its own)
  // Where the ZeRO-1 pieces go device to device (actors/optimizer_actor.h):
  // the DP group's stream collectives (null: as messages), the rank's
  // partitions by chunk (a reduce's root writes into its sum()), the
  // rank's optimizer (weak: the optimizer knows the shard) and the events
  // that order the two. `dp_alone`: dp 1, the same without a group: the
  // optimizer's stream, behind the reduced event, sums the pieces itself.
  comm::StreamCollectives* dp = nullptr;
  bool dp_alone = false;
  std::vector<const Partition*> partitions;
  caf::actor_addr optimizer;
  gpu::Event* dp_reduced = nullptr;  // recorded here
  gpu::Event* dp_params = nullptr;   // recorded by the optimizer
  caf::actor coordinator;
  FailPoint fail;
  RankTrace* trace = nullptr;  // the rank's recorder (may be null)
};

class ShardActor : public caf::event_based_actor {
 public:
  ShardActor(caf::actor_config& cfg, ShardSetup setup);
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
  enum class Arrival { kNone, kPosted, kArrived };
  enum class Pass { kTrain, kEval };  // eval: the schedule's forwards only, no gradients
  enum class Msg { kActivation, kGradient, kParams };  // what a transport completion is for

  void begin(Pass pass, int step, std::int64_t first_sample);
  // A training step's start: the rank's optimizer, then this shard.
  void begin_train(int step, std::int64_t first_sample, float loss_scale);
  void advance();
  bool try_fire(const ScheduleOp& op);
  void fire_forward(const ScheduleOp& op, int slot);
  void fire_backward(const ScheduleOp& op, int slot);
  // W's pieces [first, first + count) (count -1: the rest) of op's micro-batch.
  void fire_weight(const ScheduleOp& op, int first, int count);
  // zb-auto: fires pending W's by its rule (above); true when it fired one.
  bool auto_weights();
  // zb-auto: whether the list's next B has no stash to take (its chunk's
  // are all held by pending W's), so a W must run before it.
  bool next_backward_waits_for_a_stash() const;
  // zb-auto's clock: the stream ran dry, an input came, a piece ended.
  void note_dry();
  void note_input(int op_id);
  void note_done(int op_id);
  // What the step's last backward (or W) of `chunk` tells the buckets.
  model::GradProgress bucket_progress(int chunk);
  // The op's output (kActivation: to virtual stage vs + 1) or input
  // gradient (kGradient: to vs - 1), sent behind it.
  void stream_send(comm::MessageKind kind, const ScheduleOp& op, int slot);
  // Posts the receive op reads (its activation or output gradient) into
  // `into` (a device buffer with links, else its host mirror); true when
  // it is there, or will be when the stream gets to the op (links).
  bool post_receive(const ScheduleOp& op, comm::MessageKind kind, int src, const gpu::Tensor& into);
  void on_op_done(int op_id);
  void on_bucket(int chunk, int bucket);
  // The bucket's pieces reduced to their partitions on the compute stream
  // (with dp); true when it has tied ones, which still go as messages.
  bool reduce_bucket(int chunk, int bucket);
  void on_recv(Msg what, int id, const std::string& error);
  void on_sent(int chunk, int slot, const std::string& error);
  void post_param_receives();
  void on_params_in(int step);
  void release(int chunk, int slot);
  void maybe_ready();
  void fail(const std::string& what);
  void wait_for(const ScheduleOp* op, std::string what, int peer,
                comm::trace::What kind = comm::trace::What::kNone);
  void end_trace_wait();
  comm::trace::Event op_event(const ScheduleOp& op) const;
  WaitReport report() const;

  comm::Callback reply(Msg what, int id, gpu::Tensor keep);
  comm::Tag tag(comm::MessageKind kind, int source, int micro, int chunk, int layer) const;
  int rank_of(int d, int s) const { return setup_.layout.rank({d, s, setup_.coord.t}); }
  std::string describe(const ScheduleOp& op) const;

  // The training schedule for `m` micro-batches (made once per m).
  const std::vector<ScheduleOp>* train_ops(int m);

  ShardSetup setup_;
  std::map<int, std::vector<ScheduleOp>> train_ops_;  // by micro-batches (a ramp-up has several)
  std::vector<ScheduleOp> eval_ops_;
  const std::vector<ScheduleOp>* ops_ = &eval_ops_;  // what this step walks
  int m_ = 1;                                        // this step's micro-batches per replica
  int global_batch_ = 1;                             // and its global batch
  Pass pass_ = Pass::kTrain;
  std::vector<gpu::HostMirror> tokens_, targets_;  // per micro-batch, i32 (B, T)
  // The ops fired ahead of their input (by a link, or behind a gate the
  // receive opens) this step, by op id, for stall reports: what, from which
  // rank, whether it is there, since when it was posted.
  struct AheadWait {
    comm::MessageKind kind;
    int from;
    bool link;
    std::function<bool()> there;
    std::chrono::steady_clock::time_point since;
  };
  std::map<int, AheadWait> ahead_waits_;
  // A receive posted ahead (shared with its completion): whether it has
  // come, and the trace's wait for it, open until then.
  class Landing {
   public:
    void wait(comm::trace::Recorder& recorder, const comm::trace::Event& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (arrived_) return;
      recorder_ = &recorder;
      handle_ = recorder.open(e);
    }
    void arrive() {
      std::lock_guard<std::mutex> lock(mu_);
      arrived_ = true;
      if (recorder_ != nullptr) recorder_->close(handle_);
      recorder_ = nullptr;
    }
    bool there() {
      std::lock_guard<std::mutex> lock(mu_);
      return arrived_;
    }

   private:
    std::mutex mu_;
    bool arrived_ = false;
    comm::trace::Recorder* recorder_ = nullptr;  // (the rank's: outlives its transport)
    comm::trace::Recorder::Handle handle_ = comm::trace::Recorder::kNone;
  };
  // Whether this step's ops fire ahead of inputs that come through the
  // transport: not zb-auto's training steps, whose rule needs to see the
  // stream run dry while an input is missing.
  bool fires_ahead() const;

  // Per chunk, the host side of what crosses the transport (by slot: the
  // received activation and output gradient, the sent output and input
  // gradient, the losses), and of the parameters and gradients.
  struct Mirrors {
    std::vector<gpu::HostMirror> input, output_grad, output, input_grad, losses;
    gpu::HostMirror params, grads;
  };
  std::vector<Mirrors> mirrors_;
  // The step's new parameters: still arriving, being copied to the device
  // (not on the CPU), there.
  enum class Params { kArriving, kCopying, kIn };
  Params params_state_ = Params::kIn;

  // Per chunk: free slots, the slot of each micro-batch (-1: none), how
  // many reasons each slot is held for, backwards fired this step.
  struct ChunkState {
    std::vector<int> free;
    std::vector<int> slot_of;
    std::vector<int> holds;
    int backwards_fired = 0;
    std::vector<GradBucket> buckets;
    // Split backwards: free weight stashes, the stash of each micro-batch
    // (-1: none), W's whose last piece has fired this step.
    std::vector<int> free_stashes;
    std::vector<int> stash_of;
    int weights_fired = 0;
  };
  std::vector<ChunkState> chunk_;
  // The ops on the stream, oldest first (W pieces one each: `last` is the
  // W's final piece); each op_done is the first's.
  struct Fired {
    int op_id;
    bool last;
  };
  std::deque<Fired> fired_;
  // zb-auto: W's whose B has fired, oldest first, and the piece each is at.
  struct PendingWeight {
    int op_id;
    int next_piece;
  };
  std::deque<PendingWeight> pending_w_;
  std::vector<int> weight_op_;  // zb-auto: W's op id by chunk * m + micro
  bool stash_wait_ = false;     // the op at the cursor waits for a free stash
  // zb-auto's measurements, over the steps (reset when m changes): per op
  // id, how long after the stream ran dry its input came (EWMA, ms; -1:
  // not seen), and a W piece's time on an idle stream.
  using Clock = std::chrono::steady_clock;
  std::vector<double> input_gap_ms_;
  double piece_ms_ = -1;
  int dry_op_ = -1;  // the op whose input the dry stream waits for
  Clock::time_point dry_since_;
  int timed_piece_ = -1;  // the W piece being timed (its op id)
  Clock::time_point piece_since_;
  int recheck_op_ = -1;  // a recheck is due for this op's wait
  int overdue_op_ = -1;  // its recheck came: the input is overdue
  // Whether a W piece would end before the input of the op at the cursor
  // is due (true when nothing is known yet); else a recheck is asked for.
  bool piece_fits();

  int step_ = 0;  // 0: between steps
  // The next step's begin_step, come while this step is still in progress
  // (the coordinator begins step k+1 with step k's update when nothing is
  // due between them): taken as this shard goes ready.
  struct EarlyBegin {
    int step = 0;  // 0: none
    std::int64_t first_sample = 0;
    float loss_scale = 1;
  };
  EarlyBegin early_;
  std::int64_t first_sample_ = 0;
  float loss_scale_ = 1;  // this step's (--fp16)
  std::size_t cursor_ = 0;
  std::vector<Arrival> input_;  // per op
  int ops_done_ = 0;
  int sends_pending_ = 0;
  bool params_posted_ = false;
  // The last step's update zeroed the gradients (the pieces on the device:
  // OptimizerActor::update, before the params event this stream waits for).
  bool grads_zeroed_ = false;
  int params_expected_ = 0, params_arrived_ = 0;
  bool failed_ = false;
  std::uint64_t progress_ = 0;  // ops completed and inputs heard of, over the run
  std::string setup_error_;     // what makes the setup unusable ("" if nothing)

  // What the actor waits for (hang diagnosis).
  int wait_op_ = -1;
  std::string wait_what_;
  int wait_peer_ = -1;
  std::chrono::steady_clock::time_point wait_since_;
  // The same waits and the step, as open trace events.
  comm::trace::Recorder::Handle trace_wait_ = comm::trace::Recorder::kNone;
  comm::trace::Recorder::Handle trace_step_ = comm::trace::Recorder::kNone;
};

}  // namespace troupe::actors
