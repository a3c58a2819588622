// The CPU backend's kernels on raw pointers (row-major, contiguous; fp32
// unless a dtype is given: cpu_convert.h stages the others).
// Each runs on the calling thread's OpenMP team (a stream's worker thread
// sets its team size) and is deterministic for a given thread count; every
// reduction whose order could depend on the team size is done in a fixed
// order instead, so results are also independent of it.
//
// Shapes as in gpu/kernels.h. Kernels that read indices return false (and
// write nothing) when an index is out of range, so the caller can report it.
#pragma once

#include <cstdint>

#include "gpu/tensor.h"

namespace troupe::gpu::cpu {

using i64 = std::int64_t;

// Vocabulary slices (gpu/kernels.h VocabSlice): the rows hold ids
// [begin, begin + rows) of ids valid in [0, total). False: an id out of range.
bool embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       i64 B, i64 T, i64 C, i64 rows, i64 begin, i64 total);
// The same on bf16/f16 tables and output (`dt`), converting each row in
// registers (no widened copy of the table).
bool embedding_forward(void* out, DType dt, const std::int32_t* tokens, const void* wte,
                       const void* wpe, i64 B, i64 T, i64 C, i64 rows, i64 begin, i64 total);
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
// dw[OC,IC] += dout[N,OC]^T . inp[N,IC]: matmul_backward's weight GEMM alone.
void matmul_backward_weight(float* dw, const float* dout, const float* inp, i64 N, i64 IC, i64 OC);
// dbias[OC] += column sums of dout[N, OC] (of dtype dt), rows in order.
void bias_backward(float* dbias, const void* dout, DType dt, i64 N, i64 OC);

// Elementwise ops on tensors of one compute dtype `dt` (fp32 arithmetic).
void gelu_forward(void* out, const void* inp, DType dt, i64 n);
void gelu_backward(void* dinp, const void* inp, const void* dout, DType dt, i64 n);
void residual_forward(void* out, const void* a, const void* b, DType dt, i64 n);
void fill(void* x, float value, DType dt, i64 n);
void axpy(void* y, float alpha, const void* x, DType dt, i64 n);

void attention_forward(float* out, float* att, const float* qkv, i64 B, i64 T, i64 C, i64 NH);
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, i64 B, i64 T, i64 C, i64 NH);
// qkv[B,n,3C] at positions pos..; caches [B,NH,Tc,HS]; att[B,NH,n,Tc].
void attention_cached(float* out, float* att, float* kcache, float* vcache, const float* qkv, i64 B,
                      i64 n, i64 C, i64 NH, i64 Tc, i64 pos);

// Flash attention (cpu_flash_attention.cc): out[B,T,C] as attention_forward's,
// lse[B,NH,T] each query row's log-sum-exp of its scaled scores instead of
// the probabilities; the backward overwrites dqkv from dout, qkv, out, lse
// (delta[B,NH,T]: scratch for rowsum(dout * out)).
void flash_attention_forward(float* out, float* lse, const float* qkv, i64 B, i64 T, i64 C, i64 NH);
void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, i64 B, i64 T, i64 C, i64 NH);
// attention_cached without the probabilities' scratch.
void flash_attention_cached(float* out, float* kcache, float* vcache, const float* qkv, i64 B,
                            i64 n, i64 C, i64 NH, i64 Tc, i64 pos);

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

// bf16 linear layers on oneDNN's bf16 matmul (bf16 inputs, fp32
// accumulation, out and dinp bf16, dw and dbias fp32 added into), as
// matmul_forward/backward. Only where bf16_matmul_native(): elsewhere the
// caller widens to fp32.
void matmul_forward_bf16(void* out, const void* inp, const void* w, const void* bias, i64 N, i64 IC,
                         i64 OC);
void matmul_backward_bf16(void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                          const void* w, i64 N, i64 IC, i64 OC, bool accumulate_dinp);
void matmul_backward_weight_bf16(float* dw, const void* dout, const void* inp, i64 N, i64 IC,
                                 i64 OC);
// Whether oneDNN has a bf16 matmul for this CPU other than its reference
// loop (AVX512-BF16 or AMX instructions, or its AVX-512 emulation of them)
// for the layouts the linear layers use; decided once. ONEDNN_MAX_CPU_ISA
// limits what it may use; TROUPE_CPU_BF16_GEMM=fp32 says no (the fallback:
// widened to fp32, sgemm, rounded), so one machine tests both.
bool bf16_matmul_native();

// C[M,N] = alpha * op(A) . op(B) + beta * C through oneDNN (row-major).
void sgemm(char transa, char transb, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda,
           const float* B, i64 ldb, float beta, float* C, i64 ldc);

}  // namespace troupe::gpu::cpu
