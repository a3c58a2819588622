#include "actors/optimizer_partition.h"

#include <algorithm>
#include <cstring>

#include "gpu/ops.h"

namespace troupe::actors {

Partition::Partition(const StageCompute& chunk, int dp, int d, bool count_replicated,
                     gpu::Stream& stream, gpu::Precision precision)
    : chunk_(chunk), dp_(dp), precision_(precision) {
  range_ = partition_range(chunk.layout(), chunk.spec(), dp, d);
  const std::vector<model::ParamSpec>& specs = chunk.layout().specs();
  bool previous_counted = false;
  for (std::size_t i = 0; i < specs.size(); i++) {
    const model::ParamSpec& spec = specs[i];
    const bool counted = !(spec.replicated() && spec.slice.tp > 1 && !count_replicated);
    // A spec with its alignment padding (zeros), so counted neighbours merge.
    const std::int64_t end = i + 1 < specs.size() ? specs[i + 1].offset : chunk.layout().total();
    const Range r = range_.intersect({spec.offset, end});
    if (counted && !r.empty()) {
      if (previous_counted && !counted_.empty() && counted_.back().end == r.begin) {
        counted_.back().end = r.end;
      } else {
        counted_.push_back(r);
      }
    }
    previous_counted = counted;
  }
  if (chunk.spec().embedding && !chunk.spec().head) {
    // The head is another chunk's: its wte gradient comes here too.
    tied_ = range_.intersect(wte_range(chunk.layout())).size();
  }
  gpu::Device& dev = stream.device();
  const std::int64_t n = std::max<std::int64_t>(range_.size(), 1);
  master_ = gpu::Tensor::empty(dev, gpu::DType::kF32, {n});
  m_ = gpu::Tensor::empty(dev, gpu::DType::kF32, {n});
  v_ = gpu::Tensor::empty(dev, gpu::DType::kF32, {n});
  sum_ = gpu::Tensor::empty(dev, gpu::DType::kF32, {n});
  norm_ =
      gpu::Tensor::empty(dev, gpu::DType::kF64,
                         {std::max<std::int64_t>(1, static_cast<std::int64_t>(counted_.size()))});
  window_ = dp > 1 ? 2 : 1;  // receive the next replica while adding this one
  staging_ = gpu::Tensor::empty(dev, gpu::DType::kF32, {window_ * n});
  if (precision_ != gpu::Precision::kFp32) {
    compute_ = gpu::Tensor::empty(dev, gpu::compute_dtype(precision_), {n});
  }
  staging_host_ = gpu::HostMirror(staging_);
  norm_host_ = gpu::HostMirror(norm_);
  send_ = gpu::HostMirror(compute_.defined() ? compute_ : master_);
  // Zeros where no piece ever lands: a head chunk's range may begin in the
  // alignment padding after its wte, whose bucket goes to the embedding
  // chunk's partitions, yet the padding counts in the norm.
  gpu::ops::fill(stream, sum_, 0.0f);
  gpu::ops::fill(stream, staging_, 0.0f);
  if (staging_host_.separate()) {
    std::memset(staging_host_.host_data<float>(), 0, static_cast<std::size_t>(staging_.nbytes()));
  }
  if (range_.empty()) return;
  // The master from the chunk's parameters (bf16/fp16 ones widened: exact).
  gpu::ops::convert(stream, view(master_, 0, range_.size()),
                    view(chunk.params(), range_.begin, range_.size()));
  if (compute_.defined()) {  // the padding between tensors, which updates do not write
    gpu::ops::convert(stream, view(compute_, 0, range_.size()), view(master_, 0, range_.size()));
  }
  gpu::ops::fill(stream, view(m_, 0, range_.size()), 0.0f);
  gpu::ops::fill(stream, view(v_, 0, range_.size()), 0.0f);
}

gpu::Tensor Partition::view(const gpu::Tensor& t, std::int64_t begin, std::int64_t n) const {
  return t.view(begin, {n});
}

float* Partition::slot(int k) const {
  const std::int64_t n = std::max<std::int64_t>(range_.size(), 1);
  return staging_host_.host_data<float>() + (k % window_) * n;
}

void Partition::begin_sum(gpu::Stream& s) const {
  if (!range_.empty() && !pieces_on_device_) gpu::ops::fill(s, view(sum_, 0, range_.size()), 0.0f);
}

void Partition::add(gpu::Stream& s, int k) const {
  const std::int64_t n = k < dp_ ? range_.size() : tied_;  // a wte share: its first tied_
  if (n == 0) return;  // (a partition that begins in wte's padding gets only zeros)
  const std::int64_t at = (k % window_) * std::max<std::int64_t>(range_.size(), 1);
  staging_host_.to_device(s, at, n);
  gpu::ops::axpy(s, view(sum_, 0, n), 1.0f, view(staging_, at, n));
}

void Partition::end_sum(gpu::Stream& s) const {
  if (range_.empty()) return;
  for (std::size_t k = 0; k < counted_.size(); k++) {
    gpu::ops::squared_norm(s, norm_.view(static_cast<std::int64_t>(k), {1}),
                           view(sum_, counted_[k].begin - range_.begin, counted_[k].size()));
  }
  norm_host_.to_host(s, 0, static_cast<std::int64_t>(counted_.size()));
}

double Partition::squared_norm() const {
  double sq = 0.0;  // ranges in layout order
  const double* norms = norm_host_.host_data<double>();
  for (std::size_t k = 0; k < counted_.size(); k++) sq += norms[k];
  return sq;
}

void Partition::step(gpu::Stream& s, const model::AdamWConfig& c, float lr, int update,
                     float grad_scale) const {
  if (range_.empty()) return;
  // An update writes the compute copy as it goes; a skipped step converts
  // it (after a resume the master is the checkpoint's, and the copy is
  // made here first).
  if (update > 0) {
    adam(s, c, lr, update, grad_scale);
  } else if (compute_.defined()) {
    gpu::ops::convert(s, view(compute_, 0, range_.size()), view(master_, 0, range_.size()));
  }
  send_.to_host(s, 0, pieces_on_device_ ? tied_ : range_.size());
}

void Partition::adam(gpu::Stream& s, const model::AdamWConfig& c, float lr, int update,
                     float grad_scale) const {
  std::vector<gpu::AdamWTensor> tensors;
  tensors.reserve(chunk_.layout().specs().size());
  for (const model::ParamSpec& spec : chunk_.layout().specs()) {
    const Range r = range_.intersect({spec.offset, spec.offset + spec.numel()});
    if (r.empty()) continue;
    const std::int64_t at = r.begin - range_.begin;
    tensors.push_back(
        {.p = view(master_, at, r.size()),
         .g = view(sum_, at, r.size()),
         .m = view(m_, at, r.size()),
         .v = view(v_, at, r.size()),
         .weight_decay = spec.decay == model::Decay::kYes ? c.weight_decay : 0.0f,
         .compute = compute_.defined() ? view(compute_, at, r.size()) : gpu::Tensor{}});
  }
  gpu::ops::adamw_many(s, tensors, c.step_args(lr, update, grad_scale));  // one launch on CUDA
}

}  // namespace troupe::actors
