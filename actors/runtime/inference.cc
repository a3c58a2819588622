// The sharded forward of generation and evaluation (actors/runtime/inference.h):
// stage by stage, every TP shard of a stage on its own stream at once (they
// meet in their collectives), the stage's output carried to the next one.
#include "actors/runtime/inference.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "actors/rank/rank.h"
#include "actors/rank/tensor_link.h"
#include "comm/communicator.h"
#include "comm/groups.h"
#include "comm/inproc_transport.h"
#include "gpu/device.h"
#include "gpu/host_values.h"
#include "model/decoder.h"

namespace troupe::actors {

struct ShardedModel::Shard {
  std::unique_ptr<comm::Transport> transport;
  std::unique_ptr<comm::Communicator> tensor;  // tp > 1
  std::unique_ptr<gpu::Stream> stream;
  std::unique_ptr<model::Decoder> decoder;
  gpu::Tensor tokens;  // i32 (1, T) on the embedding stage
  gpu::Tensor logits;  // the head's last logits, gathered over the TP group
};

namespace {

absl::Status check_layout(const model::GptConfig& c, comm::Layout l) {
  if (l.tp < 1 || l.pp < 1) return absl::InvalidArgumentError("--tp and --pp must be positive");
  if (l.dp != 1 || l.virtual_stages != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference runs one replica of one chunk a stage, not dp ", l.dp, " with ",
                     l.virtual_stages, " chunks a stage"));
  }
  if (c.NH % l.tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp ", l.tp, " does not divide the model's ", c.NH, " heads"));
  }
  if (c.L % l.pp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pp ", l.pp, " does not divide the model's ", c.L, " layers"));
  }
  const std::int64_t last_begin = static_cast<std::int64_t>(c.Vp()) / l.tp * (l.tp - 1);
  if (last_begin >= c.V) {
    return absl::InvalidArgumentError(absl::StrCat("--tp ", l.tp, " leaves TP rank ", l.tp - 1,
                                                   " no real vocabulary rows (V = ", c.V, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedModel>> ShardedModel::create(
    const model::GptConfig& config, comm::Layout layout, const ParamLoader& load,
    const InferenceOptions& options) {
  const model::GptConfig c = ParallelOptions{layout}.sliced_config(config);
  if (absl::Status st = check_layout(c, layout); !st.ok()) return st;
  gpu::Device& device = options.device != nullptr ? *options.device : gpu::cpu_device();
  if (device.kind() == gpu::DeviceKind::kCuda && layout.tp > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", layout.tp, " on ", device.name(),
        ": the shards of one process share its GPU, and the in-process TP collectives are the "
        "CPU's; give --tp 1 (--pp splits the layers) or --device cpu"));
  }
  std::unique_ptr<ShardedModel> m(new ShardedModel());
  m->config_ = c;
  m->layout_ = layout;
  m->device_ = &device;
  const comm::Layout& groups = layout;
  auto fabric = std::make_shared<comm::InProcFabric>(groups.world());
  m->fabric_ = fabric;
  const gpu::DType dtype = gpu::compute_dtype(options.precision);
  const int threads = options.threads;
  std::vector<float> host;
  for (int s = 0; s < layout.pp; s++) {
    const model::StageSpec stage = model::StageSpec::pipeline(c, layout.pp, s);
    for (int t = 0; t < layout.tp; t++) {
      const int rank = layout.rank({.d = 0, .s = s, .t = t});
      auto sh = std::make_unique<Shard>();
      sh->transport = fabric->endpoint(rank);
      model::TensorParallel tp;
      tp.slice = {layout.tp, t};
      if (layout.tp > 1) {
        sh->tensor = std::make_unique<comm::Communicator>(*sh->transport, groups.tensor_group(rank),
                                                          comm::GroupKind::kTensor);
        tp = tensor_link(sh->tensor.get(), tp.slice);
      }
      sh->stream = device.make_stream({.threads = std::max(1, threads)});
      sh->decoder = std::make_unique<model::Decoder>(c, device, stage, std::move(tp), 1, dtype,
                                                     options.attention);
      if (stage.embedding) sh->tokens = gpu::Tensor::empty(device, gpu::DType::kI32, {1, c.T});
      host.assign(static_cast<std::size_t>(sh->decoder->layout().total()), 0.0f);
      if (absl::Status st = load(c, sh->decoder->layout(), host.data()); !st.ok()) return st;
      if (absl::Status st = gpu::copy_values_to_device(host, sh->decoder->params()); !st.ok()) {
        return st;
      }
      m->shards_.push_back(std::move(sh));
    }
  }
  return m;
}

ShardedModel::~ShardedModel() {
  for (auto& sh : shards_) (void)sh->stream->synchronize();
}

absl::StatusOr<std::span<const float>> ShardedModel::forward(std::span<const std::int32_t> tokens,
                                                             std::int64_t pos,
                                                             model::Logits which) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n < 1 || pos < 0 || pos + n > config_.T) {
    return absl::InvalidArgumentError(absl::StrCat(
        "positions ", pos, "..", pos + n - 1, " are outside the model's context of ", config_.T));
  }
  if (pos > fed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "position ", pos, " follows the ", fed_, " positions fed so far (a gap in the cache)"));
  }
  for (std::int32_t id : tokens) {
    if (id < 0 || id >= config_.V) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", config_.V, ")"));
    }
  }
  gpu::Device& device = *device_;
  const int P = layout_.tp;
  for (int s = 0; s < layout_.pp; s++) {
    for (int t = 0; t < P; t++) {
      Shard& sh = shard(s, t);
      gpu::Tensor ids;
      if (s == 0) {
        ids = sh.tokens.view(0, {1, n});
        if (absl::Status st = device.copy_from_host(tokens.data(), ids); !st.ok()) return st;
      } else if (absl::Status st = gpu::copy_values_to_device(boundary_, sh.decoder->input(n));
                 !st.ok()) {
        return st;
      }
      sh.decoder->forward(*sh.stream, ids, n, pos, which);
      if (s == layout_.pp - 1) sh.logits = sh.decoder->gathered_logits(*sh.stream);
    }
    for (int t = 0; t < P; t++) {
      if (absl::Status st = shard(s, t).stream->synchronize(); !st.ok()) {
        fed_ = 0;
        return st;
      }
    }
    if (s + 1 < layout_.pp) {
      const gpu::Tensor out = shard(s, 0).decoder->output();
      boundary_.resize(static_cast<std::size_t>(out.numel()));
      // (In 16 bits the values widen to fp32 here and round back exactly.)
      if (absl::Status st = gpu::copy_values_to_host(out, boundary_); !st.ok()) return st;
    }
  }
  fed_ = pos + n;
  // The head's slices, (tp, 1, rows, Vl), side by side: row r is slice 0's
  // row r, then slice 1's, ...; the first V columns are the vocabulary.
  Shard& head = shard(layout_.pp - 1, 0);
  const gpu::Tensor mine = head.decoder->logits();
  const std::int64_t rows = mine.size(1), Vl = mine.size(2), V = config_.V;
  gathered_.resize(static_cast<std::size_t>(P * rows * Vl));
  if (absl::Status st = gpu::copy_values_to_host(head.logits, gathered_); !st.ok()) return st;
  logits_.resize(static_cast<std::size_t>(rows * V));
  for (std::int64_t r = 0; r < rows; r++) {
    for (int t = 0; t < P; t++) {
      const std::int64_t col = t * Vl, take = std::clamp<std::int64_t>(V - col, 0, Vl);
      const float* from = gathered_.data() + (t * rows + r) * Vl;
      std::copy_n(from, take, logits_.data() + r * V + col);
    }
  }
  return std::span<const float>(logits_);
}

}  // namespace troupe::actors
