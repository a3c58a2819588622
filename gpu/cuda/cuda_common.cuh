// Device-side helpers shared by the kernels of gpu/cuda/*.cu: grid sizing,
// the fault word, and warp and block reductions in a fixed order (a tree of
// fixed shape, so a result never depends on scheduling).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "gpu/cuda/cuda_launch.h"

namespace troupe::gpu::cuda {

constexpr int kWarp = 32;

// Blocks of `block` threads to cover n items, capped so the grid stays legal;
// kernels loop with a grid stride past the cap.
inline int grid_for(i64 n, int block) {
  const i64 blocks = (n + block - 1) / block;
  const i64 cap = 65535L * 8;
  return static_cast<int>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

// True once an earlier op on this stream has faulted: our kernels then do
// nothing (the sticky error of the CPU backend, on the device).
__device__ __forceinline__ bool faulted(const unsigned* fault) {
  return *reinterpret_cast<const volatile unsigned*>(fault) != 0;
}

// Records fault `f` with the bound that was broken; the first one wins.
__device__ __forceinline__ void raise_fault(unsigned* fault, Fault f, i64 bound) {
  if (atomicCAS(fault, 0u, static_cast<unsigned>(f)) == 0u) {
    fault[1] = static_cast<unsigned>(bound);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A reduction over the whole block, returned to every thread: each warp
// reduces its lanes, warp 0 reduces the warps' results (lanes past the last
// warp hold `identity`). `shared` holds one value per warp; blockDim.x must be
// a multiple of 32, at most 1024, and every thread of the block must call it.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T identity, T* shared, Op warp_op) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_op(v);
  __syncthreads();  // `shared` may still be read from an earlier call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T r = lane < warps ? shared[lane] : identity;
    r = warp_op(r);  // every lane has read `shared` before the shuffles end
    if (lane == 0) shared[0] = r;
  }
  __syncthreads();
  return shared[0];
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T v) const {
    return warp_sum(v);
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float v) const { return warp_max(v); }
};

__device__ __forceinline__ float block_sum(float v, float* shared) {
  return block_reduce(v, 0.0f, shared, SumOp{});
}
__device__ __forceinline__ double block_sum(double v, double* shared) {
  return block_reduce(v, 0.0, shared, SumOp{});
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  return block_reduce(v, -INFINITY, shared, MaxOp{});
}

}  // namespace troupe::gpu::cuda
