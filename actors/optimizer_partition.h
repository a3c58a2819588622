// Partition: what one ZeRO-1 optimizer partition of a model chunk holds and
// does (the OptimizerActor, actors/optimizer_actor.h, drives one per chunk
// of its rank). Where partitions begin and end: actors/partition.h.
#pragma once

#include <cstdint>
#include <vector>

#include "actors/partition.h"
#include "actors/rank/stage_compute.h"
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
  // converted to it (compute(): bf16/fp16, half the bytes).
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
  // AdamW on the master (update: Adam's 1-based count; 0 skips it),
  // writing the compute copy as it goes (a skipped step converts it from
  // the master), and its copy for the host.
  void step(gpu::Stream& s, const model::AdamWConfig& adam, float lr, int update,
            float grad_scale) const;
  // What the shards compute with, in host memory for the transport: the
  // master, or (mixed precision) it in the compute dtype, once step() has
  // run; compute_bytes(n) are n elements of it. With the replicas' pieces
  // on the device (set_pieces_on_device), only its first tied() elements
  // are copied (the tied wte's, which still travel so).
  const char* compute() const { return send_.host_data<char>(); }
  std::size_t compute_bytes(std::int64_t n) const {
    return static_cast<std::size_t>(n) * gpu::dtype_size(send_.host().dtype);
  }
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
  gpu::Tensor compute_;                      // mixed precision: the master in bf16/fp16
  std::vector<Range> counted_;               // parts of range_ in the gradient norm
  gpu::Tensor staging_;  // (window, max(range, 1)): contribution k in slot k % window
  gpu::HostMirror staging_host_, norm_host_, send_;  // send_: of compute_ or the master
};

}  // namespace troupe::actors
