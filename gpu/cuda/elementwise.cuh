// Elementwise maps, out[i] = op(in_0[i], ..., in_{K-1}[i]) for i < n: the
// kernel and launcher that GELU, the residual, fill, axpy and convert share
// (each op file defines its op, a functor of K floats returning a float).
// The inputs have one storage type In, the output Out (float, bf16 or
// half: cuda_common.cuh); the op computes in fp32 and the result is rounded
// once, to nearest even.
//
// Tiling: a thread owns E consecutive elements per step and walks the
// steps with a grid stride. Vectorised, E = 16 bytes of the narrower of In
// and Out (4 floats, or 8 when a 16-bit type takes part), so each operand
// moves as one or two Packed128 loads and stores; elements past the last
// whole step are done one by one by the thread whose step holds them. The
// vectorised kernel needs every pointer 16-byte aligned (views may start
// anywhere: checked at launch); one that is not sends the whole op to the
// scalar kernel (E = 1). Nothing is shared between threads, so the result
// does not depend on the grid. Memory: n * (K * sizeof(In) + sizeof(Out))
// bytes, all coalesced.
//
//   struct Add { __device__ float operator()(float a, float b) const { return a + b; } };
//   return map(at, p, out, n, Add{}, a, b);  // out = a + b, all stored as p says
#pragma once

#include <utility>

#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {  // each .cu file its own copy

constexpr int kMapBlock = 256;

// The K input pointers (K may be 0: fill).
template <typename In, int K>
struct Inputs {
  const In* p[K > 0 ? K : 1];
};

template <typename Op, int K, int E, std::size_t... I>
__device__ __forceinline__ float apply(const Op& op, const float (&x)[K > 0 ? K : 1][E], int e,
                                       std::index_sequence<I...>) {
  (void)x;
  (void)e;
  return op(x[I][e]...);
}

template <int E, typename Out, typename In, int K, typename Op>
__global__ void map_kernel(const unsigned* fault, Out* out, Inputs<In, K> in, i64 n, Op op) {
  if (faulted(fault)) return;
  const i64 steps = (n + E - 1) / E;
  for (i64 s = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; s < steps;
       s += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 i0 = s * E;
    if (i0 + E <= n) {
      float x[K > 0 ? K : 1][E];
#pragma unroll
      for (int k = 0; k < K; k++) load_floats(x[k], in.p[k] + i0);
      float y[E];
#pragma unroll
      for (int e = 0; e < E; e++) y[e] = apply<Op, K, E>(op, x, e, std::make_index_sequence<K>{});
      store_floats(out + i0, y);
    } else {  // the tail of a vectorised map
      for (i64 i = i0; i < n; i++) {
        float x[K > 0 ? K : 1][1];
#pragma unroll
        for (int k = 0; k < K; k++) x[k][0] = to_float(in.p[k][i]);
        out[i] = from_float<Out>(apply<Op, K, 1>(op, x, 0, std::make_index_sequence<K>{}));
      }
    }
  }
}

template <typename Out, typename In, int K, typename Op>
cudaError_t launch_map(const Launch& at, Out* out, Inputs<In, K> in, i64 n, Op op) {
  if (n == 0) return cudaSuccess;
  constexpr int kVec = 16 / (sizeof(Out) < sizeof(In) ? sizeof(Out) : sizeof(In));
  bool aligned = aligned16(out);
  for (int k = 0; k < K; k++) aligned = aligned && aligned16(in.p[k]);
  if (aligned) {
    map_kernel<kVec><<<grid_for((n + kVec - 1) / kVec, kMapBlock), kMapBlock, 0, at.stream>>>(
        at.fault, out, in, n, op);
  } else {
    map_kernel<1><<<grid_for(n, kMapBlock), kMapBlock, 0, at.stream>>>(at.fault, out, in, n, op);
  }
  return cudaGetLastError();
}

// launch_map over tensors of one compute dtype, stored as p says; `in` are
// the op's inputs (const void*), in the order op takes them.
template <typename Op, typename... Ptrs>
cudaError_t map(const Launch& at, Precision p, void* out, i64 n, Op op, Ptrs... in) {
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    const Inputs<S, sizeof...(Ptrs)> ins{{static_cast<const S*>(in)...}};
    return launch_map(at, static_cast<S*>(out), ins, n, op);
  });
}

}  // namespace
}  // namespace troupe::gpu::cuda
