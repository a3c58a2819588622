// The CPU backend's 16-bit storage: widening bf16/f16 to fp32 and rounding
// fp32 back (gpu/precision.h's conversions, in loops GCC vectorizes), and
// Staging, which gives the fp32 kernels of cpu_kernels.h fp32 views of
// tensors stored in bf16 or f16.
//
// Ops whose inner loops are simple (GELU, residual, axpy, fill, convert)
// convert in registers; the row-wise and attention kernels run in fp32 on
// a widened copy in the stream thread's scratch and round their outputs
// once, as a bf16 kernel stores them:
//
//   cpu::Staging st;
//   float* x = st.in(inp);           // inp itself when f32, else widened
//   float* y = st.out(out);          // written back rounded by commit()
//   cpu::layernorm_forward(y, ..., x, ...);
//   st.commit();
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/tensor.h"

namespace troupe::gpu::cpu {

using i64 = std::int64_t;

// Storage formats, for kernels that convert in registers: the element type
// and its conversions to and from fp32.
struct F32 {
  using T = float;
  static inline __attribute__((always_inline)) float load(float x) { return x; }
  static inline __attribute__((always_inline)) float store(float x) { return x; }
};
struct BF16 {
  using T = std::uint16_t;
  static inline __attribute__((always_inline)) float load(T x) { return bf16_to_f32(x); }
  static inline __attribute__((always_inline)) T store(float x) { return f32_to_bf16(x); }
};
struct F16 {
  using T = std::uint16_t;
  static inline __attribute__((always_inline)) float load(T x) { return f16_to_f32(x); }
  static inline __attribute__((always_inline)) T store(float x) { return f32_to_f16(x); }
};

// Elementwise work in fixed chunks of kChunk elements, in parallel on the
// calling thread's OpenMP team: f(i0, i1) for each chunk [i0, i1). What an
// element computes, and the order of per-chunk partial sums, do not depend
// on the thread count. One chunk runs on the calling thread alone, outside
// OpenMP: opening a team wakes its threads, which costs more than a chunk's
// work (a parameter tensor's AdamW, a LayerNorm's), and even a region that
// its `if` keeps to one thread costs a system call in libgomp (the end of
// its barrier wakes a futex whether or not anyone waits there: strace -k
// showed a few dozen a step on an optimizer's stream, from fill and axpy).
constexpr i64 kChunk = 1 << 14;
template <typename F>
void for_chunks(i64 n, F&& f) {
  if (n <= kChunk) {
    if (n > 0) f(0, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (i64 i0 = 0; i0 < n; i0 += kChunk) f(i0, i0 + kChunk < n ? i0 + kChunk : n);
}

// out[i] = in[i] as fp32 (exact), for in of dtype `from` (any compute dtype).
void widen(float* out, const void* in, DType from, i64 n);
// out[i] = in[i] rounded to dtype `to`, nearest even.
void narrow(void* out, DType to, const float* in, i64 n);
// out = in between any two compute dtypes (gpu/kernels.h convert).
void convert(void* out, DType to, const void* in, DType from, i64 n);

// fp32 views of compute-dtype tensors for the duration of one op, in
// memory the calling thread keeps and reuses: one block, as large as the
// most one op has staged (no allocation once warm). Row-wise ops stage a
// block of rows at a time, so what they keep is not a copy of a whole
// tensor. Stagings nest (the inner one's buffers end first).
class Staging {
 public:
  Staging();
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // t's values in fp32 (t's own memory when it is f32); null when t is
  // undefined (an absent bias).
  const float* in(const Tensor& t);
  // fp32 to write t's new values into (t's own memory when f32); commit()
  // rounds them into t. Uninitialised.
  float* out(const Tensor& t);
  // As out(), starting from t's values (an op that adds into t).
  float* inout(const Tensor& t);
  // Writes every out()/inout() buffer back into its tensor.
  void commit();

 private:
  float* take(i64 n);
  std::int64_t first_;  // where this Staging's buffers begin in the thread's block
  std::vector<std::pair<Tensor, float*>> outs_;
};

}  // namespace troupe::gpu::cpu
