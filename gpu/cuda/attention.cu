// Causal multi-head self-attention: forward, backward and the KV-cached step
// of generation. Kernels, then launchers.
//
// The forward is fused per query row: one block computes the row's scores,
// its causal softmax and the row of the output, keeping the probabilities in
// att (the backward's input, as gpu/kernels.h asks). The backward is three
// kernels, each writing every element it owns exactly once (no atomics):
//   rows i:    datt = dy_i . v_j; dpre = att * (datt - rowsum(att * datt)) / sqrt(HS)
//   columns j: dv_j = sum_i att[i,j] dy_i;  dk_j = sum_i dpre[i,j] q_i   (i >= j)
//   rows i:    dq_i = sum_j dpre[i,j] k_j                                  (j <= i)
// Heads are strided views into qkv[B,T,3C]: q at h*HS, k at C + h*HS, v at
// 2C + h*HS of each position's row.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 128;
constexpr int kWarps = kBlock / kWarp;

// Scores of one query row against keys 0..keys-1 (a row of `keys` rows of
// stride `kstride`), the causal softmax over them, zeros up to `width`, then
// out[d] = sum_j a[j] v_j[d]. Called by the whole block.
__device__ void attend_row(float* a, float* out, const float* q, const float* k, i64 kstride,
                           const float* v, i64 vstride, i64 keys, i64 width, i64 HS, float scale) {
  __shared__ float shared[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (i64 j = warp; j < keys; j += kWarps) {
    const float* kj = k + j * kstride;
    float dot = 0.0f;
    for (i64 d = lane; d < HS; d += kWarp) dot += q[d] * kj[d];
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
  for (i64 j = threadIdx.x; j < width; j += blockDim.x) a[j] = j < keys ? a[j] * inv : 0.0f;
  __syncthreads();
  for (i64 d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (i64 j = 0; j < keys; j++) acc += a[j] * v[j * vstride + d];
    out[d] = acc;
  }
}

// Block (bh, i): query row i of head h of batch b.
__global__ void attention_forward_kernel(const unsigned* fault, float* out, float* att,
                                         const float* qkv, i64 T, i64 C, i64 NH) {
  if (faulted(fault)) return;
  const i64 row = blockIdx.x, bh = row / T, i = row % T, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH, C3 = 3 * C;
  const float* base = qkv + b * T * C3 + h * HS;
  attend_row(att + row * T, out + (b * T + i) * C + h * HS, base + i * C3, base + C, C3,
             base + 2 * C, C3, i + 1, T, HS, rsqrtf(static_cast<float>(HS)));
}

__global__ void attention_backward_rows_kernel(const unsigned* fault, float* datt,
                                               const float* dout, const float* qkv,
                                               const float* att, i64 T, i64 C, i64 NH) {
  if (faulted(fault)) return;
  __shared__ float shared[kWarp];
  const i64 row = blockIdx.x, bh = row / T, i = row % T, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH, C3 = 3 * C;
  const float* v = qkv + b * T * C3 + 2 * C + h * HS;
  const float* dy = dout + (b * T + i) * C + h * HS;
  const float* a = att + row * T;
  float* da = datt + row * T;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (i64 j = warp; j <= i; j += kWarps) {
    float dot = 0.0f;
    for (i64 d = lane; d < HS; d += kWarp) dot += dy[d] * v[j * C3 + d];
    dot = warp_sum(dot);
    if (lane == 0) da[j] = dot;
  }
  __syncthreads();
  float s = 0.0f;
  for (i64 j = threadIdx.x; j <= i; j += blockDim.x) s += a[j] * da[j];
  const float dot = block_sum(s, shared);
  const float scale = rsqrtf(static_cast<float>(HS));
  for (i64 j = threadIdx.x; j < T; j += blockDim.x) {
    da[j] = j <= i ? a[j] * (da[j] - dot) * scale : 0.0f;
  }
}

// Block (bh, j): dv_j and dk_j.
__global__ void attention_backward_keys_kernel(const unsigned* fault, float* dqkv,
                                               const float* dpre, const float* dout,
                                               const float* qkv, const float* att, i64 T, i64 C,
                                               i64 NH) {
  if (faulted(fault)) return;
  const i64 col = blockIdx.x, bh = col / T, j = col % T, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH, C3 = 3 * C;
  const float* q = qkv + b * T * C3 + h * HS;
  const float* dy = dout + b * T * C + h * HS;
  const float* a = att + bh * T * T;
  const float* p = dpre + bh * T * T;
  float* dk = dqkv + (b * T + j) * C3 + C + h * HS;
  float* dv = dk + C;
  for (i64 d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc_v = 0.0f, acc_k = 0.0f;
    for (i64 i = j; i < T; i++) {
      acc_v += a[i * T + j] * dy[i * C + d];
      acc_k += p[i * T + j] * q[i * C3 + d];
    }
    dv[d] = acc_v;
    dk[d] = acc_k;
  }
}

// Block (bh, i): dq_i.
__global__ void attention_backward_queries_kernel(const unsigned* fault, float* dqkv,
                                                  const float* dpre, const float* qkv, i64 T, i64 C,
                                                  i64 NH) {
  if (faulted(fault)) return;
  const i64 row = blockIdx.x, bh = row / T, i = row % T, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH, C3 = 3 * C;
  const float* k = qkv + b * T * C3 + C + h * HS;
  const float* p = dpre + row * T;
  float* dq = dqkv + (b * T + i) * C3 + h * HS;
  for (i64 d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (i64 j = 0; j <= i; j++) acc += p[j] * k[j * C3 + d];
    dq[d] = acc;
  }
}

// k and v of positions pos..pos+n-1 into the caches [B,NH,Tc,HS].
__global__ void cache_store_kernel(const unsigned* fault, float* kcache, float* vcache,
                                   const float* qkv, i64 B, i64 n, i64 C, i64 NH, i64 Tc, i64 pos) {
  if (faulted(fault)) return;
  const i64 HS = C / NH, total = B * n * C;
  for (i64 e = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 b = e / (n * C), i = e / C % n, c = e % C, h = c / HS, d = c % HS;
    const float* row = qkv + (b * n + i) * 3 * C;
    const i64 at = ((b * NH + h) * Tc + pos + i) * HS + d;
    kcache[at] = row[C + c];
    vcache[at] = row[2 * C + c];
  }
}

// Block (bh, i): query i (position pos + i) against cache rows 0..pos+i.
__global__ void attention_cached_kernel(const unsigned* fault, float* out, float* att,
                                        const float* kcache, const float* vcache, const float* qkv,
                                        i64 n, i64 C, i64 NH, i64 Tc, i64 pos) {
  if (faulted(fault)) return;
  const i64 row = blockIdx.x, bh = row / n, i = row % n, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH;
  attend_row(att + row * Tc, out + (b * n + i) * C + h * HS, qkv + (b * n + i) * 3 * C + h * HS,
             kcache + bh * Tc * HS, HS, vcache + bh * Tc * HS, HS, pos + i + 1, Tc, HS,
             rsqrtf(static_cast<float>(HS)));
}

}  // namespace

cudaError_t attention_forward(const Launch& at, float* out, float* att, const float* qkv, i64 B,
                              i64 T, i64 C, i64 NH) {
  const i64 rows = B * NH * T;
  if (rows == 0) return cudaSuccess;
  attention_forward_kernel<<<static_cast<unsigned>(rows), kBlock, 0, at.stream>>>(
      at.fault, out, att, qkv, T, C, NH);
  return cudaGetLastError();
}

cudaError_t attention_backward(const Launch& at, float* dqkv, float* datt, const float* dout,
                               const float* qkv, const float* att, i64 B, i64 T, i64 C, i64 NH) {
  const auto rows = static_cast<unsigned>(B * NH * T);
  if (rows == 0) return cudaSuccess;
  attention_backward_rows_kernel<<<rows, kBlock, 0, at.stream>>>(at.fault, datt, dout, qkv, att, T,
                                                                 C, NH);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  attention_backward_keys_kernel<<<rows, kBlock, 0, at.stream>>>(at.fault, dqkv, datt, dout, qkv,
                                                                 att, T, C, NH);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  attention_backward_queries_kernel<<<rows, kBlock, 0, at.stream>>>(at.fault, dqkv, datt, qkv, T, C,
                                                                    NH);
  return cudaGetLastError();
}

cudaError_t attention_cached(const Launch& at, float* out, float* att, float* kcache, float* vcache,
                             const float* qkv, i64 B, i64 n, i64 C, i64 NH, i64 Tc, i64 pos) {
  if (B * n == 0) return cudaSuccess;
  cache_store_kernel<<<grid_for(B * n * C, 256), 256, 0, at.stream>>>(at.fault, kcache, vcache, qkv,
                                                                      B, n, C, NH, Tc, pos);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  attention_cached_kernel<<<static_cast<unsigned>(B * NH * n), kBlock, 0, at.stream>>>(
      at.fault, out, att, kcache, vcache, qkv, n, C, NH, Tc, pos);
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
