// Cross-entropy of the LM head over a padded vocabulary (columns V..Vp-1 take
// no part): the fused forward (softmax statistics and loss in one pass over a
// row), the backward, and the vocab-parallel pair (partial statistics on a
// slice, then their combination). Kernels, then launchers. logits and
// dlogits are in the compute dtype (stored as S); losses, lse and the
// statistics are fp32.
//
// A block of 256 threads per row: thread t owns columns t, t + 256, ...
// (coalesced); every reduction is a fixed tree. The forward and the partial
// read a row twice (max, then the sum of exponentials), the backward reads
// it once and writes it once.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

// The row's max and sum of exp(x - max) over its first `cols` columns.
template <typename S>
__device__ void row_stats(const S* x, i64 cols, float* max_out, float* sum_out) {
  __shared__ float shared[kWarp];
  float m = -INFINITY;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, to_float(x[j]));
  m = block_max(m, shared);
  float s = 0.0f;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) s += expf(to_float(x[j]) - m);
  s = block_sum(s, shared);
  *max_out = m;
  *sum_out = s;
}

template <typename S>
__global__ void crossentropy_forward_kernel(const unsigned* fault, float* losses, float* lse,
                                            const S* logits, const std::int32_t* targets, i64 V,
                                            i64 Vp) {
  if (faulted(fault)) return;
  const i64 n = blockIdx.x;
  const S* x = logits + n * Vp;
  float m, s;
  row_stats(x, V, &m, &s);
  if (threadIdx.x == 0) {
    const float l = m + logf(s);
    lse[n] = l;
    losses[n] = l - to_float(x[targets[n]]);
  }
}

// Columns of a slice starting at id `begin` whose ids are below V.
__device__ __host__ i64 local_columns(i64 V, i64 Vp, i64 begin) {
  const i64 n = V - begin;
  return n < 0 ? 0 : (n > Vp ? Vp : n);
}

// The target's column gets its -dloss before the store, so each element is
// rounded once, as on the CPU (which rounds its fp32 row once).
template <typename S>
__global__ void crossentropy_backward_kernel(const unsigned* fault, S* dlogits, const S* logits,
                                             const float* lse, const std::int32_t* targets,
                                             float dloss, i64 V, i64 Vp, i64 begin) {
  if (faulted(fault)) return;
  const i64 n = blockIdx.x;
  const i64 valid = local_columns(V, Vp, begin);
  const float l = lse[n];
  // The target's column (targets are below V, so one in [0, Vp) is below valid).
  const i64 t = static_cast<i64>(targets[n]) - begin;
  const S* x = logits + n * Vp;
  S* d = dlogits + n * Vp;  // may alias x: each column is read, then written, by one thread
  for (i64 j = threadIdx.x; j < Vp; j += blockDim.x) {
    // (__fmul_rn: the product is rounded before the subtraction, as on the
    // CPU, not fused into an fma with it.)
    float g = j < valid ? __fmul_rn(expf(to_float(x[j]) - l), dloss) : 0.0f;
    if (j == t) g -= dloss;
    d[j] = from_float<S>(g);
  }
}

template <typename S>
__global__ void crossentropy_partial_kernel(const unsigned* fault, float* stats, const S* logits,
                                            const std::int32_t* targets, i64 V, i64 Vp, i64 begin) {
  if (faulted(fault)) return;
  const i64 n = blockIdx.x;
  const i64 valid = local_columns(V, Vp, begin);
  const S* x = logits + n * Vp;
  float m = -INFINITY, s = 0.0f;
  if (valid > 0) row_stats(x, valid, &m, &s);
  if (threadIdx.x == 0) {
    float* st = stats + n * 3;
    st[0] = m;
    st[1] = s;
    const i64 t = static_cast<i64>(targets[n]) - begin;
    st[2] = t >= 0 && t < valid ? to_float(x[t]) : 0.0f;
  }
}

__global__ void crossentropy_combine_kernel(const unsigned* fault, float* losses, float* lse,
                                            const float* stats, i64 P, i64 N) {
  if (faulted(fault)) return;
  for (i64 n = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<i64>(gridDim.x) * blockDim.x) {
    float m = -INFINITY;
    for (i64 p = 0; p < P; p++) {
      const float* st = stats + (p * N + n) * 3;
      if (st[1] > 0.0f && st[0] > m) m = st[0];
    }
    float sum = 0.0f, target = 0.0f;
    for (i64 p = 0; p < P; p++) {  // slices in rank order
      const float* st = stats + (p * N + n) * 3;
      if (st[1] > 0.0f) sum += st[1] * expf(st[0] - m);
      target += st[2];
    }
    const float l = m + logf(sum);
    lse[n] = l;
    losses[n] = l - target;
  }
}

// Rows are blocks; the grid's x dimension holds up to 2^31 - 1 of them.
unsigned row_grid(i64 N) { return static_cast<unsigned>(N); }

}  // namespace

cudaError_t crossentropy_forward(const Launch& at, Precision p, float* losses, float* lse,
                                 const void* logits, const std::int32_t* targets, i64 N, i64 V,
                                 i64 Vp) {
  if (N == 0) return cudaSuccess;
  cudaError_t err = check_indices(at, Fault::kCrossEntropyForwardTarget, targets, N, V);
  if (err != cudaSuccess) return err;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    crossentropy_forward_kernel<<<row_grid(N), kBlock, 0, at.stream>>>(
        at.fault, losses, lse, static_cast<const S*>(logits), targets, V, Vp);
    return cudaGetLastError();
  });
}

cudaError_t crossentropy_backward(const Launch& at, Precision p, void* dlogits, const void* logits,
                                  const float* lse, const std::int32_t* targets, float dloss, i64 N,
                                  i64 V, i64 Vp, i64 begin) {
  if (N == 0) return cudaSuccess;
  cudaError_t err = check_indices(at, Fault::kCrossEntropyBackwardTarget, targets, N, V);
  if (err != cudaSuccess) return err;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    crossentropy_backward_kernel<<<row_grid(N), kBlock, 0, at.stream>>>(
        at.fault, static_cast<S*>(dlogits), static_cast<const S*>(logits), lse, targets, dloss, V,
        Vp, begin);
    return cudaGetLastError();
  });
}

cudaError_t crossentropy_partial(const Launch& at, Precision p, float* stats, const void* logits,
                                 const std::int32_t* targets, i64 N, i64 V, i64 Vp, i64 begin) {
  if (N == 0) return cudaSuccess;
  cudaError_t err = check_indices(at, Fault::kCrossEntropyPartialTarget, targets, N, V);
  if (err != cudaSuccess) return err;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    crossentropy_partial_kernel<<<row_grid(N), kBlock, 0, at.stream>>>(
        at.fault, stats, static_cast<const S*>(logits), targets, V, Vp, begin);
    return cudaGetLastError();
  });
}

cudaError_t crossentropy_combine(const Launch& at, float* losses, float* lse, const float* stats,
                                 i64 P, i64 N) {
  if (N == 0) return cudaSuccess;
  crossentropy_combine_kernel<<<grid_for(N, kBlock), kBlock, 0, at.stream>>>(at.fault, losses, lse,
                                                                             stats, P, N);
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
