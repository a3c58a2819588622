// Causal multi-head self-attention: forward, backward and the KV-cached step
// of generation. Kernels, then launchers. qkv, att, out, their gradients
// and the caches are in the compute dtype (stored as S); scores and sums are
// fp32 in registers and shared memory.
//
// The forward is fused per query row: one block of 128 threads (4 warps)
// computes the row's scores (warp w takes keys w, w + 4, ..., its lanes
// split the head's HS dimensions and reduce by shuffles) into fp32 shared
// memory (T floats), its causal softmax there (block trees), stores the
// probabilities in att (the backward's input, as gpu/kernels.h asks;
// rounded to S) and computes the row of the output from the fp32
// probabilities (thread d sums over the keys). It reads q once, each k_j
// and v_j row once per query (from L2), and writes T elements of att and
// HS of out.
//
// The backward is three kernels, each writing every element it owns exactly
// once (no atomics):
//   rows i:    datt = dy_i . v_j (fp32 in shared memory);
//              dpre = att * (datt - rowsum(att * datt)) / sqrt(HS), stored in datt (S)
//   columns j: dv_j = sum_i att[i,j] dy_i;  dk_j = sum_i dpre[i,j] q_i   (i >= j)
//   rows i:    dq_i = sum_j dpre[i,j] k_j                                  (j <= i)
// A block per row (or column) of one head; thread d owns dimension d of the
// head (dv, dk, dq). In 16 bits dk and dq read dpre as stored (rounded once;
// the CPU uses its fp32 dpre).
//
// Heads are strided views into qkv[B,T,3C]: q at h*HS, k at C + h*HS, v at
// 2C + h*HS of each position's row.
#include <climits>

#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 128;
constexpr int kWarps = kBlock / kWarp;

// Scores of one query row against keys 0..keys-1 (rows of stride `kstride`)
// into `a` (shared, keys floats), the causal softmax over them, stored in
// att_row (zeros from keys up to `width`), then out[d] = sum_j a[j] v_j[d]
// with the fp32 probabilities. Called by the whole block.
template <typename S>
__device__ void attend_row(float* a, S* att_row, S* out, const S* q, const S* k, i64 kstride,
                           const S* v, i64 vstride, i64 keys, i64 width, i64 HS, float scale) {
  __shared__ float shared[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (i64 j = warp; j < keys; j += kWarps) {
    const S* kj = k + j * kstride;
    float dot = 0.0f;
    for (i64 d = lane; d < HS; d += kWarp) dot += to_float(q[d]) * to_float(kj[d]);
    dot = warp_sum(dot);
    if (lane == 0) a[j] = dot * scale;
  }
  __syncthreads();
  float m = -INFINITY;
  for (i64 j = threadIdx.x; j < keys; j += blockDim.x) m = fmaxf(m, a[j]);
  m = block_max(m, shared);
  float s = 0.0f;
  for (i64 j = threadIdx.x; j < keys; j += blockDim.x) {
    const float e = expf(a[j] - m);
    a[j] = e;
    s += e;
  }
  const float inv = 1.0f / block_sum(s, shared);  // syncs: every a[j] is written
  for (i64 j = threadIdx.x; j < width; j += blockDim.x) {
    float pj = 0.0f;
    if (j < keys) a[j] = pj = a[j] * inv;
    att_row[j] = from_float<S>(pj);
  }
  __syncthreads();
  for (i64 d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (i64 j = 0; j < keys; j++) acc += a[j] * to_float(v[j * vstride + d]);
    out[d] = from_float<S>(acc);
  }
}

// Block (bh, i): query row i of head h of batch b. Shared: T floats.
template <typename S>
__global__ void attention_forward_kernel(const unsigned* fault, S* out, S* att, const S* qkv, i64 T,
                                         i64 C, i64 NH) {
  if (faulted(fault)) return;
  extern __shared__ float scores[];
  const i64 row = blockIdx.x, bh = row / T, i = row % T, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH, C3 = 3 * C;
  const S* base = qkv + b * T * C3 + h * HS;
  attend_row(scores, att + row * T, out + (b * T + i) * C + h * HS, base + i * C3, base + C, C3,
             base + 2 * C, C3, i + 1, T, HS, rsqrtf(static_cast<float>(HS)));
}

// Block (bh, i). Shared: T floats (the row's datt).
template <typename S>
__global__ void attention_backward_rows_kernel(const unsigned* fault, S* datt, const S* dout,
                                               const S* qkv, const S* att, i64 T, i64 C, i64 NH) {
  if (faulted(fault)) return;
  extern __shared__ float da[];
  __shared__ float shared[kWarp];
  const i64 row = blockIdx.x, bh = row / T, i = row % T, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH, C3 = 3 * C;
  const S* v = qkv + b * T * C3 + 2 * C + h * HS;
  const S* dy = dout + (b * T + i) * C + h * HS;
  const S* a = att + row * T;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (i64 j = warp; j <= i; j += kWarps) {
    float dot = 0.0f;
    for (i64 d = lane; d < HS; d += kWarp) dot += to_float(dy[d]) * to_float(v[j * C3 + d]);
    dot = warp_sum(dot);
    if (lane == 0) da[j] = dot;
  }
  __syncthreads();
  float s = 0.0f;
  for (i64 j = threadIdx.x; j <= i; j += blockDim.x) s += to_float(a[j]) * da[j];
  const float dot = block_sum(s, shared);
  const float scale = rsqrtf(static_cast<float>(HS));
  S* dpre = datt + row * T;
  for (i64 j = threadIdx.x; j < T; j += blockDim.x) {
    dpre[j] = from_float<S>(j <= i ? to_float(a[j]) * (da[j] - dot) * scale : 0.0f);
  }
}

// Block (bh, j): dv_j and dk_j.
template <typename S>
__global__ void attention_backward_keys_kernel(const unsigned* fault, S* dqkv, const S* dpre,
                                               const S* dout, const S* qkv, const S* att, i64 T,
                                               i64 C, i64 NH) {
  if (faulted(fault)) return;
  const i64 col = blockIdx.x, bh = col / T, j = col % T, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH, C3 = 3 * C;
  const S* q = qkv + b * T * C3 + h * HS;
  const S* dy = dout + b * T * C + h * HS;
  const S* a = att + bh * T * T;
  const S* p = dpre + bh * T * T;
  S* dk = dqkv + (b * T + j) * C3 + C + h * HS;
  S* dv = dk + C;
  for (i64 d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc_v = 0.0f, acc_k = 0.0f;
    for (i64 i = j; i < T; i++) {
      acc_v += to_float(a[i * T + j]) * to_float(dy[i * C + d]);
      acc_k += to_float(p[i * T + j]) * to_float(q[i * C3 + d]);
    }
    dv[d] = from_float<S>(acc_v);
    dk[d] = from_float<S>(acc_k);
  }
}

// Block (bh, i): dq_i.
template <typename S>
__global__ void attention_backward_queries_kernel(const unsigned* fault, S* dqkv, const S* dpre,
                                                  const S* qkv, i64 T, i64 C, i64 NH) {
  if (faulted(fault)) return;
  const i64 row = blockIdx.x, bh = row / T, i = row % T, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH, C3 = 3 * C;
  const S* k = qkv + b * T * C3 + C + h * HS;
  const S* p = dpre + row * T;
  S* dq = dqkv + (b * T + i) * C3 + h * HS;
  for (i64 d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (i64 j = 0; j <= i; j++) acc += to_float(p[j]) * to_float(k[j * C3 + d]);
    dq[d] = from_float<S>(acc);
  }
}

// k and v of positions pos..pos+n-1 into the caches [B,NH,Tc,HS] (copies
// of S: no rounding).
template <typename S>
__global__ void cache_store_kernel(const unsigned* fault, S* kcache, S* vcache, const S* qkv, i64 B,
                                   i64 n, i64 C, i64 NH, i64 Tc, i64 pos) {
  if (faulted(fault)) return;
  const i64 HS = C / NH, total = B * n * C;
  for (i64 e = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 b = e / (n * C), i = e / C % n, c = e % C, h = c / HS, d = c % HS;
    const S* row = qkv + (b * n + i) * 3 * C;
    const i64 at = ((b * NH + h) * Tc + pos + i) * HS + d;
    kcache[at] = row[C + c];
    vcache[at] = row[2 * C + c];
  }
}

// Block (bh, i): query i (position pos + i) against cache rows 0..pos+i.
// Shared: pos + n floats.
template <typename S>
__global__ void attention_cached_kernel(const unsigned* fault, S* out, S* att, const S* kcache,
                                        const S* vcache, const S* qkv, i64 n, i64 C, i64 NH, i64 Tc,
                                        i64 pos) {
  if (faulted(fault)) return;
  extern __shared__ float scores[];
  const i64 row = blockIdx.x, bh = row / n, i = row % n, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH;
  attend_row(scores, att + row * Tc, out + (b * n + i) * C + h * HS,
             qkv + (b * n + i) * 3 * C + h * HS, kcache + bh * Tc * HS, HS, vcache + bh * Tc * HS,
             HS, pos + i + 1, Tc, HS, rsqrtf(static_cast<float>(HS)));
}

// The dynamic shared memory of `floats` floats for `kernel`: past 32 KB
// (the default limit is 48 KB, static shared included) the kernel opts in
// to more, up to the device's limit (227 KB on H100, 163 KB on A100);
// beyond it this fails, and so the op.
template <typename Kernel>
cudaError_t shared_floats(Kernel* kernel, i64 floats, std::size_t* bytes) {
  *bytes = static_cast<std::size_t>(floats) * sizeof(float);
  if (*bytes <= (32u << 10)) return cudaSuccess;
  if (*bytes > static_cast<std::size_t>(INT_MAX)) return cudaErrorInvalidValue;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(*bytes));
}

}  // namespace

cudaError_t attention_forward(const Launch& at, Precision p, void* out, void* att, const void* qkv,
                              i64 B, i64 T, i64 C, i64 NH) {
  const i64 rows = B * NH * T;
  if (rows == 0) return cudaSuccess;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    std::size_t smem = 0;
    const cudaError_t err = shared_floats(attention_forward_kernel<S>, T, &smem);
    if (err != cudaSuccess) return err;
    attention_forward_kernel<<<static_cast<unsigned>(rows), kBlock, smem, at.stream>>>(
        at.fault, static_cast<S*>(out), static_cast<S*>(att), static_cast<const S*>(qkv), T, C, NH);
    return cudaGetLastError();
  });
}

cudaError_t attention_backward(const Launch& at, Precision p, void* dqkv, void* datt,
                               const void* dout, const void* qkv, const void* att, i64 B, i64 T,
                               i64 C, i64 NH) {
  const auto rows = static_cast<unsigned>(B * NH * T);
  if (rows == 0) return cudaSuccess;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    S* dx = static_cast<S*>(dqkv);
    S* dpre = static_cast<S*>(datt);
    const S* dy = static_cast<const S*>(dout);
    const S* x = static_cast<const S*>(qkv);
    const S* a = static_cast<const S*>(att);
    std::size_t smem = 0;
    cudaError_t err = shared_floats(attention_backward_rows_kernel<S>, T, &smem);
    if (err != cudaSuccess) return err;
    attention_backward_rows_kernel<<<rows, kBlock, smem, at.stream>>>(at.fault, dpre, dy, x, a, T,
                                                                      C, NH);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    attention_backward_keys_kernel<<<rows, kBlock, 0, at.stream>>>(at.fault, dx, dpre, dy, x, a, T,
                                                                   C, NH);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    attention_backward_queries_kernel<<<rows, kBlock, 0, at.stream>>>(at.fault, dx, dpre, x, T, C,
                                                                      NH);
    return cudaGetLastError();
  });
}

cudaError_t kv_cache_store(const Launch& at, Precision p, void* kcache, void* vcache,
                           const void* qkv, i64 B, i64 n, i64 C, i64 NH, i64 Tc, i64 pos) {
  if (B * n == 0) return cudaSuccess;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    cache_store_kernel<<<grid_for(B * n * C, 256), 256, 0, at.stream>>>(
        at.fault, static_cast<S*>(kcache), static_cast<S*>(vcache), static_cast<const S*>(qkv), B,
        n, C, NH, Tc, pos);
    return cudaGetLastError();
  });
}

cudaError_t attention_cached(const Launch& at, Precision p, void* out, void* att, void* kcache,
                             void* vcache, const void* qkv, i64 B, i64 n, i64 C, i64 NH, i64 Tc,
                             i64 pos) {
  if (B * n == 0) return cudaSuccess;
  cudaError_t err = kv_cache_store(at, p, kcache, vcache, qkv, B, n, C, NH, Tc, pos);
  if (err != cudaSuccess) return err;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    S* kc = static_cast<S*>(kcache);
    S* vc = static_cast<S*>(vcache);
    const S* x = static_cast<const S*>(qkv);
    std::size_t smem = 0;
    err = shared_floats(attention_cached_kernel<S>, pos + n, &smem);
    if (err != cudaSuccess) return err;
    attention_cached_kernel<<<static_cast<unsigned>(B * NH * n), kBlock, smem, at.stream>>>(
        at.fault, static_cast<S*>(out), static_cast<S*>(att), kc, vc, x, n, C, NH, Tc, pos);
    return cudaGetLastError();
  });
}

}  // namespace troupe::gpu::cuda
