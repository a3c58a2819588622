// LayerNorm forward and backward (eps 1e-5, as GPT-2). Kernels, then
// launchers. A warp per row for the row statistics and dinp; dw and db are
// column sums over the rows (column_sum.cuh), in an order fixed by N.
#include "gpu/cuda/column_sum.cuh"
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kBlock = 256;  // 8 rows per block
constexpr int kRowsPerBlock = kBlock / kWarp;

__global__ void layernorm_forward_kernel(const unsigned* fault, float* out, float* mean,
                                         float* rstd, const float* inp, const float* w,
                                         const float* b, i64 N, i64 C) {
  if (faulted(fault)) return;
  const i64 n = blockIdx.x * static_cast<i64>(kRowsPerBlock) + threadIdx.x / kWarp;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = inp + n * C;
  float s = 0.0f;
  for (i64 i = lane; i < C; i += kWarp) s += x[i];
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (i64 i = lane; i < C; i += kWarp) {
    const float d = x[i] - m;
    v += d * d;
  }
  const float r = rsqrtf(warp_sum(v) / static_cast<float>(C) + kEps);
  float* o = out + n * C;
  for (i64 i = lane; i < C; i += kWarp) o[i] = (x[i] - m) * r * w[i] + b[i];
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), with
// dnorm = w * dout.
__global__ void layernorm_backward_dinp_kernel(const unsigned* fault, float* dinp,
                                               const float* dout, const float* inp, const float* w,
                                               const float* mean, const float* rstd, i64 N, i64 C) {
  if (faulted(fault)) return;
  const i64 n = blockIdx.x * static_cast<i64>(kRowsPerBlock) + threadIdx.x / kWarp;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = inp + n * C;
  const float* d = dout + n * C;
  const float m = mean[n], s = rstd[n];
  float acc_d = 0.0f, acc_dn = 0.0f;
  for (i64 i = lane; i < C; i += kWarp) {
    const float dnorm = w[i] * d[i];
    acc_d += dnorm;
    acc_dn += dnorm * ((x[i] - m) * s);
  }
  const float dnorm_mean = warp_sum(acc_d) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(acc_dn) / static_cast<float>(C);
  float* g = dinp + n * C;
  for (i64 i = lane; i < C; i += kWarp) {
    const float norm = (x[i] - m) * s;
    const float dnorm = w[i] * d[i];
    g[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

struct NormTimesGrad {  // dw: ((x - mean) * rstd) * dout
  const float *dout, *inp, *mean, *rstd;
  i64 C;
  __device__ float operator()(i64 n, i64 c) const {
    return (inp[n * C + c] - mean[n]) * rstd[n] * dout[n * C + c];
  }
};
struct Grad {  // db: dout
  const float* dout;
  i64 C;
  __device__ float operator()(i64 n, i64 c) const { return dout[n * C + c]; }
};

unsigned row_blocks(i64 N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

cudaError_t layernorm_forward(const Launch& at, float* out, float* mean, float* rstd,
                              const float* inp, const float* w, const float* b, i64 N, i64 C) {
  if (N == 0) return cudaSuccess;
  layernorm_forward_kernel<<<row_blocks(N), kBlock, 0, at.stream>>>(at.fault, out, mean, rstd, inp,
                                                                    w, b, N, C);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(const Launch& at, float* dinp, float* dw, float* db,
                               const float* dout, const float* inp, const float* w,
                               const float* mean, const float* rstd, i64 N, i64 C, float* scratch) {
  if (N == 0) return cudaSuccess;
  layernorm_backward_dinp_kernel<<<row_blocks(N), kBlock, 0, at.stream>>>(at.fault, dinp, dout, inp,
                                                                          w, mean, rstd, N, C);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = column_sums(at, dw, scratch, N, C, NormTimesGrad{dout, inp, mean, rstd, C});
  if (err != cudaSuccess) return err;
  return column_sums(at, db, scratch, N, C, Grad{dout, C});  // after dw's: one scratch
}

}  // namespace troupe::gpu::cuda
