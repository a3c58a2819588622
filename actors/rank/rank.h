// One rank (d, s, t) of a run: its model chunks, its ZeRO-1 optimizer
// partitions, its compute and optimizer streams (one stream with dp 1),
// its transport and its TP group's collectives, and the two actors that
// drive them (a ShardActor and an OptimizerActor). Both runtimes are made
// of these: the in-process trainer (actors/runtime/in_process.h) builds
// one per rank over the in-process transport; a worker process
// (actors/runtime/worker.h) builds its own over UCX.
//
// The buffers, streams and transport belong to this object and outlive the
// actors, so a rank ends in a fixed order: fail_pending() (every transport
// operation and collective ends with an error the actors hear; after a run
// that went well, end_pending()), the actors exit (stop_actors), drain()
// (the streams finish what they hold).
//
//   auto unit = actors::RankUnit::create({.options = sliced, .parallel = par, .rank = r,
//                                         .threads = 1}, std::move(transport));
//   RankUnit::Actors a = (*unit)->spawn(system, {.coordinator = c, .train = data});
#pragma once

#include <array>
#include <atomic>
#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/diagnostics/trace_file.h"
#include "actors/diagnostics/trace_marks.h"
#include "actors/optimizer_actor.h"
#include "actors/partition.h"
#include "actors/rank/pipeline_link.h"
#include "actors/rank/stage_compute.h"
#include "actors/schedule.h"
#include "actors/shard_actor.h"
#include "comm/communicator.h"
#include "comm/groups.h"
#include "comm/transport.h"
#include "gpu/host_mirror.h"
#include "model/checkpoint.h"
#include "model/data/datasets.h"
#include "model/trainer.h"

namespace troupe::actors {

class ConnectedCollectives;  // actors/rank/connected_collectives.h

// The layout (--tp, --pp, --dp, --virtual-stages: comm::Layout, which
// answers world(), a rank's (d, s, t), the chunks and the micro-batches)
// and how to run it.
struct ParallelOptions : comm::Layout {
  ScheduleKind schedule = ScheduleKind::k1F1B;
  // --zb-max-pending-w: zb-auto's weight stashes per chunk, the most
  // micro-batches between their B and their W (0: ZB-H1's, s + 1 on stage s).
  int zb_max_pending_w = 0;
  FailPoint fail = {};           // testing (--debug-fail-stage, --debug-stall-stage)
  double stall_timeout_s = 600;  // --stall-timeout: a run with no progress this long fails
  // The device every rank of this process computes on (null: the CPU). A
  // device the host cannot read works too (its transfers go through host
  // mirrors; the opaque CPU device tests that path where no GPU is).
  gpu::Device* device = nullptr;

  const comm::Layout& layout() const { return *this; }
  // Micro-batches per replica and step.
  int m(const model::TrainOptions& o) const { return micro_batches(o.global_batch, o.micro_batch); }
  // The model as the ranks hold it: the vocabulary padded to a multiple of
  // --make-vocab-size-divisible-by x tp (as Megatron), so it slices evenly.
  model::GptConfig sliced_config(const model::GptConfig& c) const;
  // InvalidArgument naming the flag when the layout does not fit the model
  // or the batch.
  absl::Status validate(const model::TrainOptions& o) const;
};

// The weight stashes chunk `chunk` of a stage running `ops` needs.
int stashes_for(const ParallelOptions& par, const std::vector<ScheduleOp>& ops, int chunk);

// --save, --save-interval, --keep-last, --load, --no-load-optim,
// --exit-signal-handler (Megatron's names).
struct CheckpointOptions {
  std::string save;       // save directory; "" none
  int save_interval = 0;  // steps between saves (0: only after the last)
  int keep_last = 0;      // older checkpoints than the newest K are removed (0: none)
  std::string load;       // save directory (its newest) or DIR/iter_NNNNNNN; "" none
  bool load_optim = true;
  bool exit_signal_handler = false;  // SIGTERM: save after the step in progress and end
  int exit_interval =
      0;  // --exit-interval: save (with --save) and end after a step that is a multiple
};

// What a run does with checkpoints: the flags, the one --load opened, and
// how the run hears of an exit signal and says what it saved.
struct RunCheckpoints {
  CheckpointOptions flags;
  const model::ckpt::Checkpoint* loaded = nullptr;
  std::function<bool()> exit_requested = nullptr;
  std::function<void(const std::string&)> log = nullptr;
  // Once a checkpoint is committed: its step and directory (DIR/iter_N).
  std::function<void(int step, const std::string& dir)> on_checkpoint = nullptr;
};

// --trace, --trace-steps, --trace-buffer: what each rank records (comm/trace.h).
// Every rank records, always: without --trace a flight recorder of the last
// kFlightEvents events, written when the run fails or stalls.
struct TraceOptions {
  static constexpr std::size_t kTraceEvents = std::size_t{1} << 18;  // 16 MiB a rank
  static constexpr std::size_t kFlightEvents = 4096;
  std::string dir;     // --trace DIR: written at the end, on failure, on SIGUSR1
  int first_step = 0;  // --trace-steps A:B records steps A..B only
  int last_step = 1 << 30;
  std::size_t events = 0;  // --trace-buffer: events a rank keeps (0: the defaults above)
  std::string flight_dir;  // where a failure writes without --trace ("": default_flight_dir())
  bool off = false;        // --debug-trace-off: record nothing (to measure what recording costs)
  std::size_t capacity() const {
    return events > 0 ? events : dir.empty() ? kFlightEvents : kTraceEvents;
  }
  // Where the files go when the run fails or stalls.
  std::string failure_dir() const {
    return !dir.empty() ? dir : !flight_dir.empty() ? flight_dir : default_flight_dir();
  }
};

// What a model chunk is made for: its part of the model, the micro-batches
// it holds between F and B (slots) and between B and W (stashes), and the
// pipeline stage that runs it.
struct StageRequest {
  const model::GptConfig& config;
  int B = 1;
  const model::StageSpec& spec;
  int slots = 1, stashes = 0;
  int stage = 0;
  model::TpSlice tp;  // the rank's tensor slice: its parameters' layout
};
// Makes a model chunk; the default makes a GptStage. (The pipeline
// benchmark swaps in chunks whose ops take a fixed time.)
using StageFactory = std::function<std::unique_ptr<GptStage>(const StageRequest& request)>;

struct RankSpec {
  model::TrainOptions options;  // options.model already sliced_config()
  ParallelOptions parallel;
  int rank = 0;
  int threads = 1;  // of its compute stream
  StageFactory factory = nullptr;
  // Start from this checkpoint (any layout's) instead of the seed or
  // options.init_weights: the parameters, and with load_optimizer the
  // master copy and Adam's moments of this rank's partitions.
  const model::ckpt::Checkpoint* load = nullptr;
  bool load_optimizer = true;
  TraceOptions trace;
  // This process holds this one rank, and its device is the rank's alone
  // (troupe launch's workers): on CUDA its pipeline links go GPU to GPU
  // through NCCL (actors/rank/pipeline_link.h). Elsewhere a CUDA pipeline goes
  // through host memory and the transport (ranks of one process share the
  // GPU, and NCCL takes a GPU per member).
  bool own_device = false;
};

// The size of the id connect() shares (NCCL's unique id).
inline constexpr std::size_t kConnectIdBytes = 128;

class RankUnit {
 public:
  // Builds the chunks (parameters from the seed or options.init_weights),
  // the partitions and the streams; `transport` carries every tensor of
  // this rank.
  static absl::StatusOr<std::unique_ptr<RankUnit>> create(
      const RankSpec& spec, std::unique_ptr<comm::Transport> transport);
  ~RankUnit();  // drains the streams

  struct Wiring {
    caf::actor coordinator;  // or a stand-in for it (actors/runtime/remote.h)
    const model::data::SampleSource* train = nullptr;
    const model::data::SampleSource* valid = nullptr;
  };
  struct Actors {
    caf::actor shard, optimizer;
  };
  // Once the transport reaches every peer, before spawn: what needs the
  // peers before the actors run. With --tp > 1 on a device the host cannot
  // read, the TP group's collectives: on CUDA its NCCL communicator (member
  // 0 makes NCCL's id and broadcasts it through the TP group's
  // Communicator), on the opaque device the same exchange then the
  // Communicator's. Then, on CUDA with a GPU of its own (own_device) and
  // --pp > 1, a two-member NCCL communicator per pipeline link (the sender
  // makes its id and sends it over the transport), made in the links'
  // global order. Nothing elsewhere. Every rank calls it at once (a worker
  // process after connecting its transport; the in-process runtime a
  // thread per rank); fail_pending ends it.
  absl::Status connect();
  Actors spawn(caf::actor_system& system, const Wiring& wiring);
  // Fails every pending transport operation and TP collective with `why`;
  // a TP group's NCCL communicator is aborted (its kernels end, their
  // results garbage) and the compute stream fails.
  void fail_pending(const absl::Status& why);
  // The run went well and every rank is done: what is still posted ends
  // with `why`, but the NCCL communicator, idle, is not aborted: it is
  // finalized with its peers when the unit goes (within 30 s, else
  // aborted).
  void end_pending(const absl::Status& why);
  // Waits for a checkpoint write still running, then for the streams.
  void drain();

  // At a step boundary (every stream idle): copies the state to host
  // memory, then writes it into `tmp_dir` on a thread of its own and calls
  // `done` there with the file's records or the error. Returns once the
  // copy is taken (what training waits for).
  using SaveDone = std::function<void(absl::StatusOr<std::vector<model::ckpt::TensorRecord>>)>;
  absl::Status save(const std::string& tmp_dir, SaveDone done);

  // Writes what this rank recorded to DIR/rank-NNNNN.trace.jsonl; `header`
  // gives the why and the clock (its rank, layout and schedule are filled
  // in here).
  absl::Status write_trace(const std::string& dir, TraceHeader header) const;
  comm::trace::Recorder& recorder() { return *recorder_; }

  int rank() const { return spec_.rank; }
  const comm::Coord& coord() const { return coord_; }
  comm::Transport& transport() { return *transport_; }
  const std::vector<std::unique_ptr<GptStage>>& chunks() const { return chunks_; }
  std::int64_t optimizer_state_bytes() const;
  std::int64_t optimizer_bytes() const { return optimizer_bytes_; }
  // Device bytes this rank allocated: its chunks, partitions and buffers
  // (create) and its shard's token buffers (spawn). Measured by the device,
  // for ranks created one after the other (as both runtimes do); the
  // planner's counted memory (actors/rank/memory_plan.h) predicts it.
  std::int64_t allocated_bytes() const { return allocated_bytes_; }
  std::int64_t tp_all_reduced_floats() const { return tp_floats_->load(); }
  // Activations of this rank's chunks as allocated: one micro-batch's (a
  // slot of every chunk), and the recompute workspaces.
  struct ActivationBytes {
    std::int64_t per_micro_batch = 0, workspace = 0;
  };
  ActivationBytes activation_bytes() const;

 private:
  explicit RankUnit(const RankSpec& spec) : spec_(spec) {}
  absl::Status init_params();
  // The TP link (actors/rank/tensor_link.h): host callbacks where the host can
  // read the device; else device calls, on CUDA through NCCL (made by
  // connect()), on the opaque CPU device through the Communicator.
  absl::Status make_tensor_parallel(gpu::Device& dev, model::TensorParallel* tensor);
  // connect()'s two parts: the TP group's, then the pipeline links' (on
  // CUDA their communicators; then every link's first transfer).
  absl::Status connect_tensor_parallel();
  absl::Status connect_links();
  // A group's stream collectives behind `pending` (null: none to make):
  // member 0 makes NCCL's id and broadcasts it through `group`, then NCCL's
  // communicator (its pointer in *made, for aborts); on the opaque device
  // the same exchange, then `group`'s own collectives.
  absl::Status connect_group(comm::Communicator* group, ConnectedCollectives* pending,
                             const char* name, std::atomic<comm::Collectives*>* made);
  // The ZeRO-1 pieces device to device (dp > 1 on a device the host cannot
  // read; on CUDA with a GPU of its own and NCCL): the DP group's
  // collectives, made by connect(), and the events that order the shard's
  // reduces and the optimizer's broadcasts (actors/optimizer_actor.h).
  absl::Status make_data_parallel(gpu::Device& dev);
  absl::Status make_link_communicators();
  // The pipeline links (actors/rank/pipeline_link.h) where the device's
  // activations go device to device: the opaque device's over the
  // transport (made here), CUDA's through NCCL (connect_links).
  absl::Status make_links(gpu::Device& dev);
  // Checkpoints. The state this rank saves (replica 0 its parameters; every
  // rank its partitions' master, m and v), in host memory: in place on the
  // CPU; on a device, host copies (state_), current only right after
  // state_to_host(); optimizer_state_to_device() puts the master, m and v
  // back (a --load), each with the streams idle.
  std::vector<model::ckpt::Piece> checkpoint_pieces();
  absl::Status state_to_host();
  absl::Status optimizer_state_to_device();

  RankSpec spec_;
  comm::Coord coord_;
  comm::Layout shape_;
  std::vector<GradPiece> grad_pieces_;
  std::vector<ParamPiece> param_pieces_;
  // Before the transport (it records into it) and every stream callback.
  std::unique_ptr<comm::trace::Recorder> recorder_;
  std::unique_ptr<std::atomic<int>> trace_step_ = std::make_unique<std::atomic<int>>(0);
  std::unique_ptr<RankTrace> trace_;
  std::unique_ptr<comm::Transport> transport_;
  std::unique_ptr<comm::Communicator> tensor_;  // the TP group's collectives (tp > 1)
  // On a device the host cannot read: the TP link's collectives (tp > 1);
  // on CUDA a forwarder to nccl_, which connect() makes.
  std::unique_ptr<comm::StreamCollectives> tp_device_;
  // The NCCL communicator once connect() made it (owned by tp_device_).
  std::atomic<comm::Collectives*> nccl_{nullptr};
  // The same for the DP group, where its pieces go device to device.
  std::unique_ptr<comm::Communicator> data_group_;
  std::unique_ptr<comm::StreamCollectives> dp_device_;
  std::atomic<comm::Collectives*> dp_nccl_{nullptr};
  std::unique_ptr<gpu::Event> dp_reduced_, dp_params_;
  bool dp_alone_ = false;  // dp 1: the pieces are copies on the streams (no group)
  std::atomic<bool> connect_cancelled_{false};  // fail_pending: connect()'s NCCL init gives up
  std::mutex links_mu_;
  std::vector<comm::Collectives*>
      link_nccl_;  // guarded by links_mu_: the links' NCCL communicators
  std::shared_ptr<std::atomic<std::int64_t>> tp_floats_ =
      std::make_shared<std::atomic<std::int64_t>>(0);
  std::vector<std::unique_ptr<GptStage>> chunks_;       // by chunk
  std::vector<std::unique_ptr<Partition>> partitions_;  // by chunk
  std::int64_t optimizer_bytes_ = 0;                    // what making them allocated
  std::int64_t allocated_bytes_ = 0;                    // create + spawn, by the device
  // By chunk: the parameters, the partition's master, m and v (made on first use).
  std::vector<std::array<gpu::HostMirror, 4>> state_;
  // By chunk: bf16/fp16 parameters widened for a checkpoint (empty in fp32).
  std::vector<std::vector<float>> param_values_;
  std::shared_ptr<model::ckpt::Snapshot> snapshot_;  // the last save's copy (reused)
  model::ckpt::BackgroundWrite writer_;              // a save's write (after the streams)
  // Last, so that they drain before the buffers above go away. The
  // optimizer's stream is the compute stream with dp 1, else its own.
  std::unique_ptr<gpu::Stream> stream_, own_optimizer_stream_;
  gpu::Stream* optimizer_stream_ = nullptr;
  // After the compute stream, which its streams' calls fail and wait for
  // (so they go first).
  std::unique_ptr<PipelineLinks> links_;
};

// One model chunk of a rank as a checkpoint sees it: its TP slice's layout,
// the part of the model it holds, and its buffers in host memory (params
// layout->total() floats; master, adam_m, adam_v its partition's range, or
// null where there is no optimizer state).
struct CheckpointChunk {
  const model::ParamLayout* layout = nullptr;
  model::StageSpec spec;
  float* params = nullptr;
  float* master = nullptr;
  float* adam_m = nullptr;
  float* adam_v = nullptr;
};
// The checkpoint pieces of rank `coord` of a dp-way layout: replica 0 its
// parameters, every replica its ZeRO-1 partitions' state (partition_range,
// as the Partition computes it). The one definition of what a rank saves
// and loads: RankUnit and `troupe ckpt convert` both call it.
std::vector<model::ckpt::Piece> checkpoint_pieces(const std::vector<CheckpointChunk>& chunks,
                                                  const comm::Coord& coord, int dp);

// The actor system settings troupe's runtimes use (and the message types),
// each unless `cfg` has it already. (A worker process then sets its own
// number of scheduler workers: actors/runtime/worker.h.)
void configure_actor_system(caf::actor_system_config& cfg);
// Stops `actors` (user_shutdown) and waits until every one has exited.
void stop_actors(caf::actor_system& system, const std::vector<caf::actor>& actors);

// The parameters of `chunks` (replica 0's, each a TP slice of some virtual
// stage) copied by name into their places in `whole`, a model::Gpt of the
// whole model.
absl::Status copy_into_whole(const std::vector<const GptStage*>& chunks, model::Gpt& whole);
// One slice: `params` laid out as `layout` (of a chunk of a TP rank).
absl::Status copy_slice_into_whole(const model::ParamLayout& layout, const float* params,
                                   model::Gpt& whole);
// Calls `use` with `t`'s elements as f32 in host memory: in place where the
// host can read an f32 tensor; else a synchronous copy (the streams idle;
// bf16/fp16 widened, and rounded when written back) written back after a
// successful `use` when `write_back`.
absl::Status with_host_copy(const gpu::Tensor& t, bool write_back,
                            const std::function<absl::Status(float*)>& use);

}  // namespace troupe::actors
