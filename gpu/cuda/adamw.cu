// AdamW with decoupled weight decay, in PyTorch's order (as the CPU backend):
// p *= 1 - lr*wd, then p -= lr * mhat / (sqrt(vhat) + eps). Kernel, then
// launcher; the bias corrections are computed on the host, as on the CPU.
// adamw_many also writes each updated fp32 master element into the
// tensor's compute copy (bf16/f16, rounded to nearest even) where it has
// one, so the copy costs no pass of its own.
#include <cmath>

#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

struct AdamConsts {
  float lr, beta1, beta2, eps, decay, bc1, bc2, grad_scale;
};

__device__ __forceinline__ float adamw_element(float* p, const float* g, float* m, float* v,
                                               const AdamConsts& k, float decay, i64 i) {
  const float grad = g[i] * k.grad_scale;
  const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * grad;
  const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * grad * grad;
  m[i] = mi;
  v[i] = vi;
  const float mhat = mi / k.bc1;
  const float vhat = vi / k.bc2;
  const float pi = p[i] * (1.0f - k.lr * decay);
  const float updated = pi - k.lr * mhat / (sqrtf(vhat) + k.eps);
  p[i] = updated;
  return updated;
}

__global__ void adamw_kernel(const unsigned* fault, float* p, const float* g, float* m, float* v,
                             AdamConsts k, i64 n) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    adamw_element(p, g, m, v, k, k.decay, i);
  }
}

// Up to kPieces tensors in one launch (the table travels as the kernel's
// argument, ~1.2 KB): block b works on chunk b - first_block[t] of the tensor
// t whose blocks hold b.
constexpr int kPieces = 24;
constexpr i64 kChunk = kBlock * 8;

struct PieceTable {
  float* p[kPieces];
  void* c[kPieces];  // the compute copy (of the launch's storage S), or null
  const float* g[kPieces];
  float* m[kPieces];
  float* v[kPieces];
  i64 n[kPieces];
  float decay[kPieces];
  i64 first_block[kPieces + 1];
  int count;
};

template <typename S>
__global__ void adamw_many_kernel(const unsigned* fault, PieceTable t, AdamConsts k) {
  if (faulted(fault)) return;
  const i64 b = blockIdx.x;
  int i = 0;
  while (i + 1 < t.count && t.first_block[i + 1] <= b) i++;
  const i64 begin = (b - t.first_block[i]) * kChunk;
  const i64 end = begin + kChunk < t.n[i] ? begin + kChunk : t.n[i];
  S* copy = static_cast<S*>(t.c[i]);
  for (i64 e = begin + threadIdx.x; e < end; e += blockDim.x) {
    const float updated = adamw_element(t.p[i], t.g[i], t.m[i], t.v[i], k, t.decay[i], e);
    if (copy != nullptr) copy[e] = from_float<S>(updated);
  }
}

AdamConsts consts(float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale) {
  return {lr,
          beta1,
          beta2,
          eps,
          weight_decay,
          1.0f - std::pow(beta1, static_cast<float>(step)),
          1.0f - std::pow(beta2, static_cast<float>(step)),
          grad_scale};
}

}  // namespace

cudaError_t adamw(const Launch& at, float* p, const float* g, float* m, float* v, i64 n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale) {
  if (n == 0) return cudaSuccess;
  const AdamConsts k = consts(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  adamw_kernel<<<grid_for(n, kBlock), kBlock, 0, at.stream>>>(at.fault, p, g, m, v, k, n);
  return cudaGetLastError();
}

cudaError_t adamw_many(const Launch& at, const AdamWPiece* pieces, int count, Precision compute,
                       float lr, float beta1, float beta2, float eps, int step, float grad_scale) {
  const AdamConsts k = consts(lr, beta1, beta2, eps, 0.0f, step, grad_scale);
  for (int first = 0; first < count; first += kPieces) {
    PieceTable t{};
    t.count = count - first < kPieces ? count - first : kPieces;
    i64 blocks = 0;
    for (int j = 0; j < t.count; j++) {
      const AdamWPiece& piece = pieces[first + j];
      t.p[j] = piece.p;
      t.c[j] = piece.compute;
      t.g[j] = piece.g;
      t.m[j] = piece.m;
      t.v[j] = piece.v;
      t.n[j] = piece.n;
      t.decay[j] = piece.weight_decay;
      t.first_block[j] = blocks;
      blocks += (piece.n + kChunk - 1) / kChunk;
    }
    t.first_block[t.count] = blocks;
    if (blocks == 0) continue;
    const cudaError_t err = with_storage(compute, [&](auto st) {
      using S = typename decltype(st)::type;
      adamw_many_kernel<S><<<static_cast<unsigned>(blocks), kBlock, 0, at.stream>>>(at.fault, t, k);
      return cudaGetLastError();
    });
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace troupe::gpu::cuda
