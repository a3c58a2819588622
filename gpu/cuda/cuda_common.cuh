// Device-side helpers shared by the kernels of gpu/cuda/*.cu: grid sizing,
// the fault word, warp and block reductions in a fixed order (a tree of
// fixed shape, so a result never depends on scheduling), and the storage
// types of the compute dtype (gpu/kernels.h).
//
// Storage: a kernel is templated on S, the storage type of its
// compute-dtype tensors (float, __nv_bfloat16 or __half); it widens what it loads to fp32
// (exact), computes in fp32 in registers and rounds what it stores to
// nearest even (fp16 overflows to inf, as gpu/precision.h on the CPU). A
// launcher picks S from the Precision it is given:
//
//   return with_storage(p, [&](auto s) {
//     using S = typename decltype(s)::type;
//     my_kernel<S><<<grid, block, 0, at.stream>>>(at.fault, static_cast<S*>(out), ...);
//     return cudaGetLastError();
//   });
//
// Memory-bound kernels move 16 bytes per access through Packed128<T> (4
// floats or 8 halves, llm.c's pattern) where their pointers allow it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

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

// The storage type of a Precision, as a tag a generic lambda can name.
template <typename T>
struct StorageOf {
  using type = T;
};

// f(StorageOf<S>{}) for p's storage type S; every branch must return the
// same type.
template <typename F>
auto with_storage(Precision p, F&& f) {
  switch (p) {
    case Precision::kBf16:
      return f(StorageOf<__nv_bfloat16>{});
    case Precision::kFp16:
      return f(StorageOf<__half>{});
    case Precision::kFp32:
      break;
  }
  return f(StorageOf<float>{});
}

// Loads widen to fp32 (exact); stores round to nearest even.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// 16 bytes of T: one 128-bit load or store (LDG.128/STG.128) at an address
// that must be 16-byte aligned.
template <typename T>
struct alignas(16) Packed128 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];

  __device__ float get(int k) const { return to_float(v[k]); }
  __device__ void set(int k, float x) { v[k] = from_float<T>(x); }
};

template <typename T>
__device__ __forceinline__ Packed128<T> load128(const T* p) {
  const int4 bits = *reinterpret_cast<const int4*>(p);
  Packed128<T> r;
  memcpy(&r, &bits, sizeof bits);
  return r;
}
template <typename T>
__device__ __forceinline__ void store128(T* p, const Packed128<T>& x) {
  int4 bits;
  memcpy(&bits, &x, sizeof bits);
  *reinterpret_cast<int4*>(p) = bits;
}

// Whether a pointer may be read or written as Packed128 (checked at launch:
// views may start anywhere).
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// E consecutive elements of p, widened into x: as Packed128 loads when E
// elements fill whole 16-byte vectors (p then 16-byte aligned), else one by
// one.
template <int E, typename T>
__device__ __forceinline__ void load_floats(float (&x)[E], const T* p) {
  if constexpr (E * sizeof(T) % 16 == 0) {
    constexpr int P = Packed128<T>::kSize;
#pragma unroll
    for (int j = 0; j < E / P; j++) {
      const Packed128<T> v = load128(p + j * P);
#pragma unroll
      for (int k = 0; k < P; k++) x[j * P + k] = v.get(k);
    }
  } else {
#pragma unroll
    for (int k = 0; k < E; k++) x[k] = to_float(p[k]);
  }
}
// x rounded into E consecutive elements of p (as load_floats).
template <int E, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&x)[E]) {
  if constexpr (E * sizeof(T) % 16 == 0) {
    constexpr int P = Packed128<T>::kSize;
#pragma unroll
    for (int j = 0; j < E / P; j++) {
      Packed128<T> v;
#pragma unroll
      for (int k = 0; k < P; k++) v.set(k, x[j * P + k]);
      store128(p + j * P, v);
    }
  } else {
#pragma unroll
    for (int k = 0; k < E; k++) p[k] = from_float<T>(x[k]);
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
