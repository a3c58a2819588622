// The CPU backend's kernels on raw pointers (fp32, row-major, contiguous).
// Each runs on the calling thread's OpenMP team (a stream's worker thread
// sets its team size) and is deterministic for a given thread count; every
// reduction whose order could depend on the team size is done in a fixed
// order instead, so results are also independent of it.
//
// Shapes as in gpu/kernels.h. Kernels that read indices return false (and
// write nothing) when an index is out of range, so the caller can report it.
#pragma once

#include <cstdint>

#include "gpu/precision.h"

namespace troupe::gpu::cpu {

using i64 = std::int64_t;

// Vocabulary slices (gpu/kernels.h VocabSlice): the rows hold ids
// [begin, begin + rows) of ids valid in [0, total). False: an id out of range.
bool embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       i64 B, i64 T, i64 C, i64 rows, i64 begin, i64 total);
bool embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        i64 B, i64 T, i64 C, i64 rows, i64 begin, i64 total);

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, i64 N, i64 C);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, i64 N, i64 C);

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, i64 N, i64 IC,
                    i64 OC);
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, i64 N, i64 IC, i64 OC, bool accumulate_dinp);

void gelu_forward(float* out, const float* inp, i64 n);
void gelu_backward(float* dinp, const float* inp, const float* dout, i64 n);

void attention_forward(float* out, float* att, const float* qkv, i64 B, i64 T, i64 C, i64 NH);
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, i64 B, i64 T, i64 C, i64 NH);
// qkv[B,n,3C] at positions pos..; caches [B,NH,Tc,HS]; att[B,NH,n,Tc].
void attention_cached(float* out, float* att, float* kcache, float* vcache, const float* qkv, i64 B,
                      i64 n, i64 C, i64 NH, i64 Tc, i64 pos);

void residual_forward(float* out, const float* a, const float* b, i64 n);

bool crossentropy_forward(float* losses, float* lse, const float* logits,
                          const std::int32_t* targets, i64 N, i64 V, i64 Vp);
// Column j of the Vp logits is id begin + j; ids below V take part.
bool crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const std::int32_t* targets, float dloss, i64 N, i64 V, i64 Vp,
                           i64 begin);
bool crossentropy_partial(float* stats, const float* logits, const std::int32_t* targets, i64 N,
                          i64 V, i64 Vp, i64 begin);
void crossentropy_combine(float* losses, float* lse, const float* stats, i64 P, i64 N);

double squared_norm(const float* x, i64 n);
void adamw(float* p, const float* g, float* m, float* v, i64 n, float lr, float beta1, float beta2,
           float eps, float weight_decay, int step, float grad_scale);
void fill(float* x, float value, i64 n);
void axpy(float* y, float alpha, const float* x, i64 n);
void round_to(float* out, const float* in, i64 n, Precision p);  // out may be in

// C[M,N] = alpha * op(A) . op(B) + beta * C through oneDNN (row-major).
void sgemm(char transa, char transb, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda,
           const float* B, i64 ldb, float beta, float* C, i64 ldc);

}  // namespace troupe::gpu::cpu
