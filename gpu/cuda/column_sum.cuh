// Column sums over many rows, deterministic and parallel: out[c] += sum over
// n of value(n, c), an fp32 functor that reads the op's tensors in their
// storage (the compute dtype, widened); out is an fp32 main gradient. The
// rows are cut into chunks whose size depends on N alone
// (column_rows_per_chunk in cuda_launch.h); a block sums a tile of 32
// columns over one chunk (8 row lanes, then the lanes in order) into
// partial[chunk, c], and a second kernel adds the chunks in order. Used for
// the parameter gradients that are sums over all rows (LayerNorm's dw and
// db, a linear layer's dbias): a thread per column walking every row would
// leave most of the GPU idle.
#pragma once

#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {  // each .cu file its own copy

constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;  // blocks of kColumnTile * kRowLanes = 256 threads

template <typename Value>
__global__ void column_partials_kernel(const unsigned* fault, float* partial, i64 N, i64 C,
                                       i64 rows_per_chunk, Value value) {
  if (faulted(fault)) return;
  __shared__ float lanes[kRowLanes][kColumnTile];
  const int tc = threadIdx.x % kColumnTile, tr = threadIdx.x / kColumnTile;
  const i64 c = blockIdx.x * static_cast<i64>(kColumnTile) + tc;
  const i64 chunk = blockIdx.y;
  const i64 n0 = chunk * rows_per_chunk;
  const i64 n1 = n0 + rows_per_chunk < N ? n0 + rows_per_chunk : N;
  float s = 0.0f;
  if (c < C) {
    for (i64 n = n0 + tr; n < n1; n += kRowLanes) s += value(n, c);
  }
  lanes[tr][tc] = s;
  __syncthreads();
  if (tr == 0 && c < C) {
    float t = 0.0f;
    for (int r = 0; r < kRowLanes; r++) t += lanes[r][tc];
    partial[chunk * C + c] = t;
  }
}

__global__ void column_finish_kernel(const unsigned* fault, float* out, const float* partial,
                                     i64 chunks, i64 C) {
  if (faulted(fault)) return;
  for (i64 c = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<i64>(gridDim.x) * blockDim.x) {
    float s = out[c];
    for (i64 k = 0; k < chunks; k++) s += partial[k * C + c];
    out[c] = s;
  }
}

// out[c] += sum over n < N of value(n, c), through `partial` (scratch of
// column_chunks(N) * C floats).
template <typename Value>
cudaError_t column_sums(const Launch& at, float* out, float* partial, i64 N, i64 C, Value value) {
  if (N == 0 || C == 0) return cudaSuccess;
  const i64 rows = column_rows_per_chunk(N), chunks = column_chunks(N);
  const dim3 grid(static_cast<unsigned>((C + kColumnTile - 1) / kColumnTile),
                  static_cast<unsigned>(chunks));
  column_partials_kernel<<<grid, kColumnTile * kRowLanes, 0, at.stream>>>(at.fault, partial, N, C,
                                                                          rows, value);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  column_finish_kernel<<<grid_for(C, 256), 256, 0, at.stream>>>(at.fault, out, partial, chunks, C);
  return cudaGetLastError();
}

}  // namespace
}  // namespace troupe::gpu::cuda
