// Checkpoints: the whole training state of a run, one file per rank, and a
// manifest that says where every element of every tensor is, so that any
// layout loads into any other.
//
//   DIR/latest_checkpointed_iteration.txt     "40\n": the newest complete one
//   DIR/iter_0000040/manifest.json            written last (the commit)
//   DIR/iter_0000040/rank_00003.safetensors   rank 3's tensors
//
// A rank's file holds, of each model chunk it runs, its TP slice of every
// parameter (replica d = 0 only: the other replicas hold the same) and,
// of its ZeRO-1 partition, the fp32 master copy and Adam's m and v: a
// contiguous range of the chunk's flat buffer, stored per parameter it
// touches as a 1-D tensor of the slice's elements [begin, end). Every tensor
// is recorded in the manifest with the parameter's global shape, how TP
// slices it (split, tp, t, the slice's shape), its element range and the
// CRC-32 (zlib) of its bytes. Loading assembles a parameter's global tensor
// from the pieces and takes from it the elements the new slice holds, by the
// same global_index() that init and weights use: tp, pp, dp, v and the
// schedule may all differ. wte's vocabulary padding rows (zero, as the loss
// never reaches them) are whatever the new padding needs.
//
// Atomic: ranks write into DIR/iter_NNNNNNN.tmp-<id>/; the manifest goes in
// after every rank has fsynced its file, the directory is renamed into
// place, the tracker replaced by rename last. A crash at any point leaves
// the previous checkpoint and a tracker that names a complete one.
//
//   absl::StatusOr<std::string> tmp = ckpt::begin_save(dir, step);
//   absl::StatusOr<std::vector<ckpt::TensorRecord>> r = ckpt::write_rank_file(*tmp, rank, pieces);
//   RETURN_IF_ERROR(ckpt::commit(dir, *tmp, meta, records, keep_last));
//   absl::StatusOr<ckpt::Checkpoint> c = ckpt::Checkpoint::open(dir);   // the newest
//   RETURN_IF_ERROR(c->fill(piece));
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/safetensors.h"
#include "model/trainer.h"

namespace troupe::model::ckpt {

inline constexpr int kFormat = 1;  // the manifest's "format_version"
inline constexpr const char* kTracker = "latest_checkpointed_iteration.txt";

enum class Kind { kParam, kMaster, kAdamM, kAdamV };
const char* kind_name(Kind k);  // "param", "master", "adam_m", "adam_v"

// A range of one model chunk's flat buffer of one kind, in host memory: what
// a rank writes (data is read) or loads (data is written).
struct Piece {
  Kind kind = Kind::kParam;
  const ParamLayout* layout = nullptr;  // the chunk's layout (its TP slice)
  std::int64_t begin = 0, end = 0;      // elements of the flat buffer
  float* data = nullptr;                // element `begin`
  // The chunk's wte is the LM head's tied copy of another chunk's: it is
  // not written (the embedding chunk's is); loading fills it all the same.
  bool tied_copy = false;
};

// One tensor of a rank's file, as the manifest lists it.
struct TensorRecord {
  std::string file;   // "rank_00003.safetensors"
  std::string name;   // in the file: "<kind>/<parameter>"
  std::string param;  // "h.0.attn.c_attn.weight"
  Kind kind = Kind::kParam;
  std::vector<std::int64_t> global_shape;  // unsliced (wte: the writer's padded rows)
  std::vector<std::int64_t> slice_shape;   // this TP slice's
  Split split = Split::kNone;
  int tp = 1, t = 0;
  std::int64_t begin = 0, end = 0;  // elements of the slice in this tensor
  std::uint32_t crc32 = 0;
};

// What a checkpoint says besides its tensors.
struct Meta {
  int step = 0;                       // optimizer steps done
  std::int64_t consumed_samples = 0;  // training samples read
  int evaluations_done = 0;
  // The loss scaler's state and the steps it skipped (none in checkpoints
  // of older troupes: a resume then starts a fresh scaler).
  std::optional<LossScaleState> loss_scale;
  TrainOptions options;  // the run's (model as the ranks held it)
  int tp = 1, pp = 1, dp = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
  std::string writer;  // "troupe 0.1.0"
  int world() const { return tp * pp * dp; }
  std::string describe_layout() const;  // "tp=2 pp=2 dp=1 1f1b"
};

// "troupe 0.1.0": the writer of every checkpoint this build makes.
std::string writer_name();

// "iter_0000040".
std::string iter_name(int step);
std::string rank_file_name(int rank);  // "rank_00003.safetensors"

// Takes DIR/.troupe-save.lock (flock) for this process's lifetime, so that
// no two runs save into one directory (each would remove the other's
// temporaries); again in the same process: OK. FailedPrecondition naming
// the directory when another process holds it.
absl::Status lock_save_dir(const std::string& dir);

// Removes stale temporaries (iter_*.tmp-*: saves a crash interrupted),
// makes DIR and a fresh temporary for `step`'s checkpoint, and returns it.
absl::StatusOr<std::string> begin_save(const std::string& dir, int step);

// Writes `pieces` as rank `rank`'s file in `tmp_dir` (atomically, fsynced)
// and returns the records of its tensors.
absl::StatusOr<std::vector<TensorRecord>> write_rank_file(const std::string& tmp_dir, int rank,
                                                          const std::vector<Piece>& pieces);

// After every rank's file is written: the manifest into `tmp_dir`, the
// directory renamed to DIR/iter_NNNNNNN (a checkpoint of that step already
// there is replaced), the tracker replaced, and with keep_last > 0 every
// older checkpoint but the newest keep_last removed.
absl::Status commit(const std::string& dir, const std::string& tmp_dir, const Meta& meta,
                    const std::vector<TensorRecord>& records, int keep_last);

// Records to and from the text of a message between processes (JSON).
std::string records_to_text(const std::vector<TensorRecord>& records);
absl::StatusOr<std::vector<TensorRecord>> records_from_text(const std::string& text);

// A complete checkpoint, open for reading.
class Checkpoint {
 public:
  // `path` is a checkpoint directory (DIR/iter_0000040), or a save
  // directory whose tracker names one. Every problem (no checkpoint, a
  // manifest that is not one, a rank file missing) names the path.
  static absl::StatusOr<Checkpoint> open(const std::string& path);

  const std::string& dir() const { return dir_; }  // DIR/iter_NNNNNNN
  const Meta& meta() const { return meta_; }
  const std::vector<TensorRecord>& records() const { return records_; }
  // Every difference between the checkpoint's model and `config`, as one
  // FailedPrecondition naming each (the vocabulary padding may differ).
  absl::Status check_model(const GptConfig& config) const;
  // A resume (step, data position and optimizer state) needs the same
  // global batch and data as the run that saved: FailedPrecondition
  // naming each difference otherwise (a fine-tune, --no-load-optim, does
  // not).
  absl::Status check_resume(const TrainOptions& options) const;
  // Reads every file and checks every tensor's size and checksum.
  absl::Status verify() const;
  // Fills `piece` (any layout's chunk and range) from the checkpoint.
  absl::Status fill(const Piece& piece) const;
  // One parameter's global tensor of `kind` (the writer's padded shape).
  absl::StatusOr<std::vector<float>> global_tensor(Kind kind, const std::string& param,
                                                   std::vector<std::int64_t>* shape) const;
  bool has(Kind kind) const;

 private:
  absl::StatusOr<const SafetensorsFile*> file(const std::string& name) const;
  // A record's bytes from its file, its CRC-32 checked (DataLoss naming it).
  absl::Status read_piece(const TensorRecord& r, std::vector<char>* bytes) const;
  // global_tensor() into the cache (valid until the next call).
  absl::StatusOr<const std::vector<float>*> assemble(Kind kind, const std::string& param,
                                                     std::vector<std::int64_t>* shape) const;

  std::string dir_;
  Meta meta_;
  std::vector<TensorRecord> records_;
  std::map<std::string, std::vector<std::size_t>> by_tensor_;  // "<kind>/<param>" -> records
  // Opened rank files (headers only) and the last global tensor assembled.
  struct Cache;
  std::shared_ptr<Cache> cache_;
};

// The pieces of one chunk: with its partition's range, the state kinds too.
// (A runtime's rank lists these for each of its chunks.)
void add_chunk_pieces(const ParamLayout& layout, bool tied_copy, bool params,
                      std::int64_t part_begin, std::int64_t part_end, float* param_data,
                      float* master, float* adam_m, float* adam_v, std::vector<Piece>* out);

// A copy of a rank's pieces in host memory: what a save stalls training
// for. Its pieces() are the same ranges, pointing into the copy. (The
// runtimes hold their state in host memory; a device backend copies out.)
class Snapshot {
 public:
  static Snapshot take(const std::vector<Piece>& live);
  // take() again into this snapshot's memory when the pieces are the same
  // sizes (every save of a run): no new pages to fault in, so the copy is
  // all training waits for.
  void retake(const std::vector<Piece>& live);
  const std::vector<Piece>& pieces() const { return pieces_; }
  std::int64_t bytes() const;

 private:
  std::vector<std::vector<float>> buffers_;
  std::vector<Piece> pieces_;
};

// One write at a time on a thread of its own: start() waits for the write
// before it. The destructor waits too.
class BackgroundWrite {
 public:
  BackgroundWrite() = default;
  BackgroundWrite(const BackgroundWrite&) = delete;
  BackgroundWrite& operator=(const BackgroundWrite&) = delete;
  ~BackgroundWrite() { wait(); }
  void start(std::function<void()> write);
  void wait();
  bool busy() const { return thread_.joinable(); }

 private:
  std::thread thread_;
};

// When a run saves after `step`: every `interval` steps (0: never), after
// the last of `steps`, and when an exit was asked for.
inline bool save_due(int step, int steps, int interval, bool exiting) {
  return exiting || step == steps || (interval > 0 && step % interval == 0);
}

}  // namespace troupe::model::ckpt
