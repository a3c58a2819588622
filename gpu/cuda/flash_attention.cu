// Flash attention on CUDA: the forward, backward and KV-cached step of
// gpu/kernels.h's flash family, in every compute dtype, for head sizes up
// to kMaxHS (GPT-2's 64, GPT-3's 128, MT-NLG 530B's 160). Kernels, then
// launchers. Nothing T x T is stored: the forward keeps each query row's
// log-sum-exp (fp32), the backward recomputes the probabilities from it.
//
// One warp owns one row. Keys go by in chunks of 32, a key per lane: the
// lane's score (q . k_j over the head, fp32, in the dimensions' order),
// the online softmax across the warp (the row's running maximum m and sum
// l rescale the output so far), then the chunk's probabilities broadcast
// lane by lane to the output accumulators (lane e owns dimensions e,
// e + 32, ...). The backward is three kernels, each writing every element
// it owns once (no atomics: bitwise the same from run to run):
//   rows i:  D_i = dout_i . out_i                                (delta)
//   keys j:  dv_j = sum_{i>=j} P_ij dout_i;  dk_j = sum_{i>=j} dS_ij q_i
//   rows i:  dq_i = sum_{j<=i} dS_ij k_j
// with P_ij = exp(q_i . k_j / sqrt(HS) - lse_i) and dS_ij = P_ij (dout_i .
// v_j - D_i) / sqrt(HS), recomputed in both (FlashAttention-2's split of
// dK/dV and dQ into passes over the other side, which is what makes it
// deterministic).
//
// The forward in bf16/fp16 at head sizes 64 and 128 runs on the tensor
// cores instead (flash_attention_mma.cu). The rest are CUDA cores and read
// k and v from L2 once per row: linear in memory, not yet fast
// (docs/CUDA.md); the reference kernel (attention.cu) stays --device cuda's default until
// scripts/gpu-check has run this one on a GPU.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kRows = 4;  // warps (rows) a block
constexpr int kThreads = kRows * kWarp;
constexpr int kMaxHS = 256;
constexpr int kDims = kMaxHS / kWarp;  // output dimensions a lane may own

// One query row against keys 0..keys-1 (rows of stride kstride / vstride):
// out = softmax(q . k^T * scale) . v, and lse (when not null) its
// log-sum-exp. qs: the warp's HS floats of shared memory. Called by a
// whole warp.
template <typename S>
__device__ void flash_row(float* qs, S* out, float* lse, const S* q, const S* k, i64 kstride,
                          const S* v, i64 vstride, i64 keys, int HS, float scale) {
  const int lane = threadIdx.x % kWarp;
  for (int d = lane; d < HS; d += kWarp) qs[d] = to_float(q[d]);
  __syncwarp();
  float o[kDims] = {};
  float m = -INFINITY, l = 0.0f;
  for (i64 j0 = 0; j0 < keys; j0 += kWarp) {
    const i64 j = j0 + lane;
    float s = -INFINITY;
    if (j < keys) {
      const S* kj = k + j * kstride;
      float dot = 0.0f;
      for (int d = 0; d < HS; d++) dot += qs[d] * to_float(kj[d]);
      s = dot * scale;
    }
    const float mx = fmaxf(m, warp_max(s));  // finite: lane 0's key is always there
    const float corr = expf(m - mx);         // 0 at the first chunk (m = -inf)
    const float p = j < keys ? expf(s - mx) : 0.0f;
    l = l * corr + warp_sum(p);
    m = mx;
#pragma unroll
    for (int e = 0; e < kDims; e++) o[e] *= corr;
    const int n = keys - j0 < kWarp ? static_cast<int>(keys - j0) : kWarp;
    for (int jj = 0; jj < n; jj++) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const S* vj = v + (j0 + jj) * vstride;
#pragma unroll
      for (int e = 0; e < kDims; e++) {
        const int d = lane + e * kWarp;
        if (d < HS) o[e] += pj * to_float(vj[d]);
      }
    }
  }
  const float inv = 1.0f / l;
#pragma unroll
  for (int e = 0; e < kDims; e++) {
    const int d = lane + e * kWarp;
    if (d < HS) out[d] = from_float<S>(o[e] * inv);
  }
  if (lse != nullptr && lane == 0) *lse = m + logf(l);
}

// Warp w of block x: row `rows - 1 - (x * kRows + w)` of rows B*NH*T (the
// last rows first: the longest for the query-row kernels, the shortest for
// the key-row one), or -1 past the end.
__device__ i64 warp_row(i64 rows) {
  const i64 r = static_cast<i64>(blockIdx.x) * kRows + threadIdx.x / kWarp;
  return r < rows ? rows - 1 - r : -1;
}

template <typename S>
__global__ void flash_forward_kernel(const unsigned* fault, S* out, float* lse, const S* qkv, i64 T,
                                     i64 C, i64 NH, i64 rows) {
  if (faulted(fault)) return;
  __shared__ float qs[kRows][kMaxHS];
  const i64 row = warp_row(rows);
  if (row < 0) return;
  const i64 bh = row / T, i = row % T, b = bh / NH, h = bh % NH;
  const i64 HS = C / NH, C3 = 3 * C;
  const S* base = qkv + b * T * C3 + h * HS;
  flash_row(qs[threadIdx.x / kWarp], out + (b * T + i) * C + h * HS, lse + row, base + i * C3,
            base + C, C3, base + 2 * C, C3, i + 1, static_cast<int>(HS),
            rsqrtf(static_cast<float>(HS)));
}

// delta[row] = dout_i . out_i over the head's dimensions.
template <typename S>
__global__ void flash_delta_kernel(const unsigned* fault, float* delta, const S* dout, const S* out,
                                   i64 T, i64 C, i64 NH, i64 rows) {
  if (faulted(fault)) return;
  const i64 row = warp_row(rows);
  if (row < 0) return;
  const i64 bh = row / T, i = row % T, b = bh / NH, h = bh % NH, HS = C / NH;
  const i64 at = (b * T + i) * C + h * HS;
  const int lane = threadIdx.x % kWarp;
  float acc = 0.0f;
  for (i64 d = lane; d < HS; d += kWarp) acc += to_float(dout[at + d]) * to_float(out[at + d]);
  acc = warp_sum(acc);
  if (lane == 0) delta[row] = acc;
}

// A recomputed probability and its score gradient for query i, key j.
struct PdS {
  float p, ds;
};
__device__ __forceinline__ PdS p_ds(float dot_qk, float dot_dov, float lse, float D, float scale) {
  const float p = expf(dot_qk * scale - lse);
  return {p, p * (dot_dov - D) * scale};
}

// Warp per key row j: dk_j and dv_j over the queries i >= j, a query per
// lane, in order.
template <typename S>
__global__ void flash_backward_kv_kernel(const unsigned* fault, S* dqkv, const S* dout,
                                         const S* qkv, const float* lse, const float* delta, i64 T,
                                         i64 C, i64 NH, i64 rows) {
  if (faulted(fault)) return;
  __shared__ float kvs[kRows][2 * kMaxHS];
  const i64 row = warp_row(rows);
  if (row < 0) return;
  const i64 bh = row / T, j = row % T, b = bh / NH, h = bh % NH;
  const int HS = static_cast<int>(C / NH), lane = threadIdx.x % kWarp;
  const i64 C3 = 3 * C;
  const S* q = qkv + b * T * C3 + h * HS;   // row i at q + i * C3
  const S* dy = dout + b * T * C + h * HS;  // row i at dy + i * C
  float* ks = kvs[threadIdx.x / kWarp];
  float* vs = ks + kMaxHS;
  for (int d = lane; d < HS; d += kWarp) {
    ks[d] = to_float(q[j * C3 + C + d]);
    vs[d] = to_float(q[j * C3 + 2 * C + d]);
  }
  __syncwarp();
  const float scale = rsqrtf(static_cast<float>(HS));
  const float* L = lse + bh * T;
  const float* D = delta + bh * T;
  float dk[kDims] = {}, dv[kDims] = {};
  for (i64 i0 = j; i0 < T; i0 += kWarp) {
    const i64 i = i0 + lane;
    PdS g{0.0f, 0.0f};
    if (i < T) {
      float sq = 0.0f, sd = 0.0f;
      for (int d = 0; d < HS; d++) {
        sq += to_float(q[i * C3 + d]) * ks[d];
        sd += to_float(dy[i * C + d]) * vs[d];
      }
      g = p_ds(sq, sd, L[i], D[i], scale);
    }
    const int n = T - i0 < kWarp ? static_cast<int>(T - i0) : kWarp;
    for (int ii = 0; ii < n; ii++) {
      const float p = __shfl_sync(0xffffffffu, g.p, ii);
      const float ds = __shfl_sync(0xffffffffu, g.ds, ii);
      const S* qi = q + (i0 + ii) * C3;
      const S* dyi = dy + (i0 + ii) * C;
#pragma unroll
      for (int e = 0; e < kDims; e++) {
        const int d = lane + e * kWarp;
        if (d < HS) {
          dv[e] += p * to_float(dyi[d]);
          dk[e] += ds * to_float(qi[d]);
        }
      }
    }
  }
  S* dk_row = dqkv + (b * T + j) * C3 + C + h * HS;
#pragma unroll
  for (int e = 0; e < kDims; e++) {
    const int d = lane + e * kWarp;
    if (d < HS) {
      dk_row[d] = from_float<S>(dk[e]);
      dk_row[C + d] = from_float<S>(dv[e]);
    }
  }
}

// Warp per query row i: dq_i over the keys j <= i, a key per lane, in order.
template <typename S>
__global__ void flash_backward_q_kernel(const unsigned* fault, S* dqkv, const S* dout, const S* qkv,
                                        const float* lse, const float* delta, i64 T, i64 C, i64 NH,
                                        i64 rows) {
  if (faulted(fault)) return;
  __shared__ float qds[kRows][2 * kMaxHS];
  const i64 row = warp_row(rows);
  if (row < 0) return;
  const i64 bh = row / T, i = row % T, b = bh / NH, h = bh % NH;
  const int HS = static_cast<int>(C / NH), lane = threadIdx.x % kWarp;
  const i64 C3 = 3 * C;
  const S* base = qkv + b * T * C3 + h * HS;
  const S* k = base + C;  // row j at k + j * C3
  const S* v = base + 2 * C;
  float* qs = qds[threadIdx.x / kWarp];
  float* dys = qs + kMaxHS;
  for (int d = lane; d < HS; d += kWarp) {
    qs[d] = to_float(base[i * C3 + d]);
    dys[d] = to_float(dout[(b * T + i) * C + h * HS + d]);
  }
  __syncwarp();
  const float scale = rsqrtf(static_cast<float>(HS));
  const float Li = lse[row], Di = delta[row];
  float dq[kDims] = {};
  for (i64 j0 = 0; j0 <= i; j0 += kWarp) {
    const i64 j = j0 + lane;
    float ds = 0.0f;
    if (j <= i) {
      float sq = 0.0f, sd = 0.0f;
      for (int d = 0; d < HS; d++) {
        sq += qs[d] * to_float(k[j * C3 + d]);
        sd += dys[d] * to_float(v[j * C3 + d]);
      }
      ds = p_ds(sq, sd, Li, Di, scale).ds;
    }
    const int n = i + 1 - j0 < kWarp ? static_cast<int>(i + 1 - j0) : kWarp;
    for (int jj = 0; jj < n; jj++) {
      const float dsj = __shfl_sync(0xffffffffu, ds, jj);
      const S* kj = k + (j0 + jj) * C3;
#pragma unroll
      for (int e = 0; e < kDims; e++) {
        const int d = lane + e * kWarp;
        if (d < HS) dq[e] += dsj * to_float(kj[d]);
      }
    }
  }
  S* dq_row = dqkv + (b * T + i) * C3 + h * HS;
#pragma unroll
  for (int e = 0; e < kDims; e++) {
    const int d = lane + e * kWarp;
    if (d < HS) dq_row[d] = from_float<S>(dq[e]);
  }
}

// Warp per new position i (at pos + i) of rows B*NH*n, against cache rows
// 0..pos+i.
template <typename S>
__global__ void flash_cached_kernel(const unsigned* fault, S* out, const S* kcache, const S* vcache,
                                    const S* qkv, i64 n, i64 C, i64 NH, i64 Tc, i64 pos, i64 rows) {
  if (faulted(fault)) return;
  __shared__ float qs[kRows][kMaxHS];
  const i64 row = warp_row(rows);
  if (row < 0) return;
  const i64 bh = row / n, i = row % n, b = bh / NH, h = bh % NH, HS = C / NH;
  flash_row(qs[threadIdx.x / kWarp], out + (b * n + i) * C + h * HS, static_cast<float*>(nullptr),
            qkv + (b * n + i) * 3 * C + h * HS, kcache + bh * Tc * HS, HS, vcache + bh * Tc * HS,
            HS, pos + i + 1, static_cast<int>(HS), rsqrtf(static_cast<float>(HS)));
}

unsigned blocks_for(i64 rows) { return static_cast<unsigned>((rows + kRows - 1) / kRows); }

}  // namespace

cudaError_t flash_attention_forward(const Launch& at, Precision p, void* out, float* lse,
                                    const void* qkv, i64 B, i64 T, i64 C, i64 NH) {
  const i64 rows = B * NH * T;
  if (rows == 0) return cudaSuccess;
  if (C / NH > kMaxHS) return cudaErrorInvalidValue;
  if (flash_forward_mma_fits(p, qkv, B, T, C, NH)) {
    return flash_forward_mma(at, p, out, lse, qkv, B, T, C, NH);
  }
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    flash_forward_kernel<<<blocks_for(rows), kThreads, 0, at.stream>>>(
        at.fault, static_cast<S*>(out), lse, static_cast<const S*>(qkv), T, C, NH, rows);
    return cudaGetLastError();
  });
}

cudaError_t flash_attention_backward(const Launch& at, Precision p, void* dqkv, float* delta,
                                     const void* dout, const void* qkv, const void* out,
                                     const float* lse, i64 B, i64 T, i64 C, i64 NH) {
  const i64 rows = B * NH * T;
  if (rows == 0) return cudaSuccess;
  if (C / NH > kMaxHS) return cudaErrorInvalidValue;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    S* dx = static_cast<S*>(dqkv);
    const S* dy = static_cast<const S*>(dout);
    const S* x = static_cast<const S*>(qkv);
    flash_delta_kernel<<<blocks_for(rows), kThreads, 0, at.stream>>>(
        at.fault, delta, dy, static_cast<const S*>(out), T, C, NH, rows);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    flash_backward_kv_kernel<<<blocks_for(rows), kThreads, 0, at.stream>>>(at.fault, dx, dy, x, lse,
                                                                           delta, T, C, NH, rows);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    flash_backward_q_kernel<<<blocks_for(rows), kThreads, 0, at.stream>>>(at.fault, dx, dy, x, lse,
                                                                          delta, T, C, NH, rows);
    return cudaGetLastError();
  });
}

cudaError_t flash_attention_cached(const Launch& at, Precision p, void* out, void* kcache,
                                   void* vcache, const void* qkv, i64 B, i64 n, i64 C, i64 NH,
                                   i64 Tc, i64 pos) {
  const i64 rows = B * NH * n;
  if (rows == 0) return cudaSuccess;
  if (C / NH > kMaxHS) return cudaErrorInvalidValue;
  cudaError_t err = kv_cache_store(at, p, kcache, vcache, qkv, B, n, C, NH, Tc, pos);
  if (err != cudaSuccess) return err;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    flash_cached_kernel<<<blocks_for(rows), kThreads, 0, at.stream>>>(
        at.fault, static_cast<S*>(out), static_cast<const S*>(kcache),
        static_cast<const S*>(vcache), static_cast<const S*>(qkv), n, C, NH, Tc, pos, rows);
    return cudaGetLastError();
  });
}

}  // namespace troupe::gpu::cuda
