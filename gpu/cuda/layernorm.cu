// LayerNorm forward and backward (eps 1e-5, as GPT-2). Kernels, then
// launchers. inp, out, w, b, dout and dinp are in the compute dtype (stored
// as S); mean and rstd are fp32, and so are dw and db (main gradients,
// added into).
//
// A warp per row (8 rows per 256-thread block) for the row statistics and
// dinp: lane l owns columns l, l + 32, ... (coalesced), reductions are warp
// trees. The forward reads a row three times (mean, variance, output; the
// later reads hit L1/L2) and writes it once; the backward's dinp reads inp,
// dout and w twice and reads and writes dinp once. dw and db are column sums
// over the rows (column_sum.cuh), in an order fixed by N.
#include "gpu/cuda/column_sum.cuh"
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kBlock = 256;  // 8 rows per block
constexpr int kRowsPerBlock = kBlock / kWarp;

// Row n's statistics and output, by its warp, given `sum`: this lane's
// part of the sum of x (the mean's first pass, which the callers make).
template <typename S>
__device__ void normalize_row(S* out, float* mean, float* rstd, const S* x, const S* w, const S* b,
                              i64 n, i64 C, int lane, float sum) {
  const float m = warp_sum(sum) / static_cast<float>(C);
  float v = 0.0f;
  for (i64 i = lane; i < C; i += kWarp) {
    const float d = to_float(x[i]) - m;
    v += d * d;
  }
  const float r = rsqrtf(warp_sum(v) / static_cast<float>(C) + kEps);
  S* o = out + n * C;
  for (i64 i = lane; i < C; i += kWarp) {
    o[i] = from_float<S>((to_float(x[i]) - m) * r * to_float(w[i]) + to_float(b[i]));
  }
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

template <typename S>
__global__ void layernorm_forward_kernel(const unsigned* fault, S* out, float* mean, float* rstd,
                                         const S* inp, const S* w, const S* b, i64 N, i64 C) {
  if (faulted(fault)) return;
  const i64 n = blockIdx.x * static_cast<i64>(kRowsPerBlock) + threadIdx.x / kWarp;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarp;
  const S* x = inp + n * C;
  float s = 0.0f;
  for (i64 i = lane; i < C; i += kWarp) s += to_float(x[i]);
  normalize_row(out, mean, rstd, x, w, b, n, C, lane, s);
}

// residual = a + b (rounded to S), then the forward above of the rounded
// sum (the same normalize_row: bitwise the unfused pair): each lane reads
// back only the columns it wrote.
template <typename S>
__global__ void residual_layernorm_forward_kernel(const unsigned* fault, S* residual, S* out,
                                                  float* mean, float* rstd, const S* a, const S* b,
                                                  const S* w, const S* bias, i64 N, i64 C) {
  if (faulted(fault)) return;
  const i64 n = blockIdx.x * static_cast<i64>(kRowsPerBlock) + threadIdx.x / kWarp;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarp;
  const S *xa = a + n * C, *xb = b + n * C;
  S* x = residual + n * C;
  float s = 0.0f;
  for (i64 i = lane; i < C; i += kWarp) {
    const S r = from_float<S>(to_float(xa[i]) + to_float(xb[i]));
    x[i] = r;
    s += to_float(r);
  }
  normalize_row(out, mean, rstd, x, w, bias, n, C, lane, s);
}

// dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), with
// dnorm = w * dout.
template <typename S>
__global__ void layernorm_backward_dinp_kernel(const unsigned* fault, S* dinp, const S* dout,
                                               const S* inp, const S* w, const float* mean,
                                               const float* rstd, i64 N, i64 C) {
  if (faulted(fault)) return;
  const i64 n = blockIdx.x * static_cast<i64>(kRowsPerBlock) + threadIdx.x / kWarp;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarp;
  const S* x = inp + n * C;
  const S* d = dout + n * C;
  const float m = mean[n], s = rstd[n];
  float acc_d = 0.0f, acc_dn = 0.0f;
  for (i64 i = lane; i < C; i += kWarp) {
    const float dnorm = to_float(w[i]) * to_float(d[i]);
    acc_d += dnorm;
    acc_dn += dnorm * ((to_float(x[i]) - m) * s);
  }
  const float dnorm_mean = warp_sum(acc_d) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(acc_dn) / static_cast<float>(C);
  S* g = dinp + n * C;
  for (i64 i = lane; i < C; i += kWarp) {
    const float norm = (to_float(x[i]) - m) * s;
    const float dnorm = to_float(w[i]) * to_float(d[i]);
    g[i] = from_float<S>(to_float(g[i]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
  }
}

template <typename S>
struct NormTimesGrad {  // dw: ((x - mean) * rstd) * dout
  const S *dout, *inp;
  const float *mean, *rstd;
  i64 C;
  __device__ float operator()(i64 n, i64 c) const {
    return (to_float(inp[n * C + c]) - mean[n]) * rstd[n] * to_float(dout[n * C + c]);
  }
};
template <typename S>
struct Grad {  // db: dout
  const S* dout;
  i64 C;
  __device__ float operator()(i64 n, i64 c) const { return to_float(dout[n * C + c]); }
};

unsigned row_blocks(i64 N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

cudaError_t layernorm_forward(const Launch& at, Precision p, void* out, float* mean, float* rstd,
                              const void* inp, const void* w, const void* b, i64 N, i64 C) {
  if (N == 0) return cudaSuccess;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    layernorm_forward_kernel<<<row_blocks(N), kBlock, 0, at.stream>>>(
        at.fault, static_cast<S*>(out), mean, rstd, static_cast<const S*>(inp),
        static_cast<const S*>(w), static_cast<const S*>(b), N, C);
    return cudaGetLastError();
  });
}

cudaError_t residual_layernorm_forward(const Launch& at, Precision p, void* residual, void* out,
                                       float* mean, float* rstd, const void* a, const void* b,
                                       const void* w, const void* bias, i64 N, i64 C) {
  if (N == 0) return cudaSuccess;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    residual_layernorm_forward_kernel<<<row_blocks(N), kBlock, 0, at.stream>>>(
        at.fault, static_cast<S*>(residual), static_cast<S*>(out), mean, rstd,
        static_cast<const S*>(a), static_cast<const S*>(b), static_cast<const S*>(w),
        static_cast<const S*>(bias), N, C);
    return cudaGetLastError();
  });
}

cudaError_t layernorm_backward(const Launch& at, Precision p, void* dinp, float* dw, float* db,
                               const void* dout, const void* inp, const void* w, const float* mean,
                               const float* rstd, i64 N, i64 C, float* scratch) {
  if (N == 0) return cudaSuccess;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    const S* d = static_cast<const S*>(dout);
    const S* x = static_cast<const S*>(inp);
    layernorm_backward_dinp_kernel<<<row_blocks(N), kBlock, 0, at.stream>>>(
        at.fault, static_cast<S*>(dinp), d, x, static_cast<const S*>(w), mean, rstd, N, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    err = column_sums(at, dw, scratch, N, C, NormTimesGrad<S>{d, x, mean, rstd, C});
    if (err != cudaSuccess) return err;
    return column_sums(at, db, scratch, N, C, Grad<S>{d, C});  // after dw's: one scratch
  });
}

}  // namespace troupe::gpu::cuda
