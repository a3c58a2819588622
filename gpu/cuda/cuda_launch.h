// The CUDA backend's launchers: one per op, each in gpu/cuda/<op>.cu with its
// kernels. A launcher enqueues its kernels on `at.stream` and returns the
// launch error (cudaSuccess once enqueued); its arguments were checked by
// gpu/ops.cc (shapes, dtypes, devices), so only data-dependent errors remain,
// and those a kernel reports through the stream's fault word (below).
//
// The fault word: two unsigned ints in device memory, one pair per stream.
// A kernel that finds an index out of range stores its Fault code in word 0
// (the first store wins) and the bound it broke in word 1; every kernel of
// ours returns at once while word 0 is set, so after a fault the stream's
// later ops are skipped, as on the CPU backend. The stream copies the word to
// the host on the stream itself (at synchronize and before host callbacks) and
// turns it into an error naming the op.
//
// Shapes, semantics and dtypes as in gpu/kernels.h; pointers are device
// pointers. This header is host code (no CUDA half types in it): the .cc
// files of the backend include it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/precision.h"

namespace troupe::gpu::cuda {

using i64 = std::int64_t;

// What a kernel found wrong in its data (word 0 of the fault word).
enum class Fault : unsigned {
  kNone = 0,
  kEmbeddingForwardToken = 1,   // a token id outside [0, bound)
  kEmbeddingBackwardToken = 2,  // a token id outside [0, bound)
  kCrossEntropyForwardTarget = 3,
  kCrossEntropyBackwardTarget = 4,
  kCrossEntropyPartialTarget = 5,
};

// "embedding_forward: a token id is outside [0, 50257)", as the CPU backend
// says it.
const char* fault_op(Fault f);
const char* fault_what(Fault f);

struct Launch;
// Raises `code` (with `bound`) if an id is outside [0, bound) (check_indices.cu).
cudaError_t check_indices(const Launch& at, Fault code, const std::int32_t* ids, i64 n, i64 bound);

struct Launch {
  cudaStream_t stream = nullptr;
  unsigned* fault = nullptr;  // the stream's fault word (device memory)
};

// Column sums over N rows (gpu/cuda/column_sum.cuh) cut the rows into chunks
// of a size that depends on N alone (so results do not depend on the GPU),
// at most 65535 of them; their scratch is column_chunks(N) * C floats.
inline i64 column_rows_per_chunk(i64 N) {
  const i64 need = (N + 65534) / 65535;
  return need > 256 ? need : 256;
}
inline i64 column_chunks(i64 N) {
  const i64 rows = column_rows_per_chunk(N);
  return (N + rows - 1) / rows;
}

// Dtypes (gpu/kernels.h): tensors in the op's compute dtype are `void*`,
// stored as the launcher's `Precision p` says (kFp32: float, kBf16:
// __nv_bfloat16, kFp16: __half); the f32-only ones (parameter gradients,
// LayerNorm statistics, losses, lse, the loss statistics, the optimizer's
// tensors) are float*.
cudaError_t embedding_forward(const Launch& at, Precision p, void* out, const std::int32_t* tokens,
                              const void* wte, const void* wpe, i64 B, i64 T, i64 C, i64 rows,
                              i64 begin, i64 total);
cudaError_t embedding_backward(const Launch& at, Precision p, float* dwte, float* dwpe,
                               const void* dout, const std::int32_t* tokens, i64 B, i64 T, i64 C,
                               i64 rows, i64 begin, i64 total);
cudaError_t layernorm_forward(const Launch& at, Precision p, void* out, float* mean, float* rstd,
                              const void* inp, const void* w, const void* b, i64 N, i64 C);
// `scratch`: column_chunks(N) * C floats.
// residual = a + b, then layernorm_forward of it, in one pass over the rows.
cudaError_t residual_layernorm_forward(const Launch& at, Precision p, void* residual, void* out,
                                       float* mean, float* rstd, const void* a, const void* b,
                                       const void* w, const void* bias, i64 N, i64 C);
cudaError_t layernorm_backward(const Launch& at, Precision p, void* dinp, float* dw, float* db,
                               const void* dout, const void* inp, const void* w, const float* mean,
                               const float* rstd, i64 N, i64 C, float* scratch);
cudaError_t gelu_forward(const Launch& at, Precision p, void* out, const void* inp, i64 n);
cudaError_t gelu_backward(const Launch& at, Precision p, void* dinp, const void* inp,
                          const void* dout, i64 n);
// The attention kernels keep a row of scores in fp32 shared memory, T
// floats (attention_cached: pos + n), opting in past 32 KB up to the
// device's limit: T up to ~41K on A100 (163 KB), ~58K on H100 (227 KB);
// past that the launch fails (cudaErrorInvalidValue).
cudaError_t attention_forward(const Launch& at, Precision p, void* out, void* att, const void* qkv,
                              i64 B, i64 T, i64 C, i64 NH);
cudaError_t attention_backward(const Launch& at, Precision p, void* dqkv, void* datt,
                               const void* dout, const void* qkv, const void* att, i64 B, i64 T,
                               i64 C, i64 NH);
cudaError_t attention_cached(const Launch& at, Precision p, void* out, void* att, void* kcache,
                             void* vcache, const void* qkv, i64 B, i64 n, i64 C, i64 NH, i64 Tc,
                             i64 pos);
// The n new positions' k and v of qkv[B,n,3C] into rows pos.. of the caches.
cudaError_t kv_cache_store(const Launch& at, Precision p, void* kcache, void* vcache,
                           const void* qkv, i64 B, i64 n, i64 C, i64 NH, i64 Tc, i64 pos);
// Flash attention (flash_attention.cu): no T x T memory; head sizes up to
// 256 (cudaErrorInvalidValue past it).
cudaError_t flash_attention_forward(const Launch& at, Precision p, void* out, float* lse,
                                    const void* qkv, i64 B, i64 T, i64 C, i64 NH);
// Its tensor-core forward (flash_attention_mma.cu), which
// flash_attention_forward runs where it fits: bf16/fp16, head size 64 or
// 128, qkv 16-byte aligned, grid dimensions within CUDA's limits.
bool flash_forward_mma_fits(Precision p, const void* qkv, i64 B, i64 T, i64 C, i64 NH);
cudaError_t flash_forward_mma(const Launch& at, Precision p, void* out, float* lse, const void* qkv,
                              i64 B, i64 T, i64 C, i64 NH);
cudaError_t flash_attention_backward(const Launch& at, Precision p, void* dqkv, float* delta,
                                     const void* dout, const void* qkv, const void* out,
                                     const float* lse, i64 B, i64 T, i64 C, i64 NH);
cudaError_t flash_attention_cached(const Launch& at, Precision p, void* out, void* kcache,
                                   void* vcache, const void* qkv, i64 B, i64 n, i64 C, i64 NH,
                                   i64 Tc, i64 pos);
cudaError_t residual_forward(const Launch& at, Precision p, void* out, const void* a, const void* b,
                             i64 n);
cudaError_t crossentropy_forward(const Launch& at, Precision p, float* losses, float* lse,
                                 const void* logits, const std::int32_t* targets, i64 N, i64 V,
                                 i64 Vp);
// dlogits may be logits.
cudaError_t crossentropy_backward(const Launch& at, Precision p, void* dlogits, const void* logits,
                                  const float* lse, const std::int32_t* targets, float dloss, i64 N,
                                  i64 V, i64 Vp, i64 begin);
cudaError_t crossentropy_partial(const Launch& at, Precision p, float* stats, const void* logits,
                                 const std::int32_t* targets, i64 N, i64 V, i64 Vp, i64 begin);
cudaError_t crossentropy_combine(const Launch& at, float* losses, float* lse, const float* stats,
                                 i64 P, i64 N);
// out[0] = sum of x^2 in double, in a fixed order (two passes, no atomics),
// through `partial`, device scratch of squared_norm_partials(n) doubles.
i64 squared_norm_partials(i64 n);
cudaError_t squared_norm(const Launch& at, double* out, const float* x, i64 n, double* partial);
cudaError_t adamw(const Launch& at, float* p, const float* g, float* m, float* v, i64 n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale);
// One tensor of adamw_many: n elements of each, its own weight decay, and
// where it has one its compute copy (stored as adamw_many's `compute`).
struct AdamWPiece {
  float* p;
  const float* g;
  float* m;
  float* v;
  i64 n;
  float weight_decay;
  void* compute = nullptr;
};
// adamw over `count` tensors, in launches of up to 24 tensors each; the
// updated p also rounded into each piece's compute copy.
cudaError_t adamw_many(const Launch& at, const AdamWPiece* pieces, int count, Precision compute,
                       float lr, float beta1, float beta2, float eps, int step, float grad_scale);
// x[:] = value (rounded to p's format); y += alpha * x.
cudaError_t fill(const Launch& at, Precision p, void* x, float value, i64 n);
cudaError_t axpy(const Launch& at, Precision p, void* y, float alpha, const void* x, i64 n);
// out (stored as `to`) = in (stored as `from`), rounded to nearest even.
// With to == from a copy: out may be in, but must not overlap it otherwise;
// with to != from they must not overlap.
cudaError_t convert(const Launch& at, void* out, Precision to, const void* in, Precision from,
                    i64 n);

// dbias[o] += sum over rows of dout[:, o] (matmul_bias.cu, a column sum;
// `scratch`: column_chunks(N) * OC floats). The GEMMs themselves are cuBLASLt
// calls, gpu/cuda/cuda_matmul.h.
cudaError_t bias_grad(const Launch& at, Precision p, float* dbias, const void* dout, i64 N, i64 OC,
                      float* scratch);
// out[n, o] += bias[o] (both stored as p says): the bias where cuBLASLt's
// epilogue cannot take it.
cudaError_t bias_add(const Launch& at, Precision p, void* out, const void* bias, i64 N, i64 OC);

}  // namespace troupe::gpu::cuda
