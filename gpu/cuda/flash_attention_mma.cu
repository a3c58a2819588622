// Flash attention's forward on the tensor cores (mma.sync m16n8k16, bf16 or
// fp16 in, fp32 accumulation; sm_80 and newer), for head sizes 64 and 128:
// FlashAttention-2's forward (Dao 2023). flash_attention.cu's launcher
// calls it for those dtypes and sizes; its CUDA-core kernels do the rest.
//
// A block of 4 warps takes 64 query rows of one (batch, head), 16 a warp,
// and walks the key/value tiles of 64 rows up to its causal limit (the
// last block first: the longest). Per tile: K and V into shared memory
// (rows past T are zeros); each warp's S = Q K^T (16 x 64, fp32 in
// registers), scaled and masked; the online softmax of its rows (the
// maximum and sum across the 4 threads that share a row); P rounded to the
// input dtype and O += P V on the tensor cores. At the end O / l is
// written and lse = m + log l. Fixed orders throughout: deterministic.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"): with g = lane / 4 and
// t = lane % 4, A's registers hold (row g, cols 2t, 2t+1), (g+8, 2t..),
// (g, 2t+8..), (g+8, 2t+8..); B's (k 2t, 2t+1; n g), (k 2t+8, 2t+9; n g);
// C's (g, 2t..), (g+8, 2t..). C's layout of S is A's layout of P, so P
// never leaves the registers.
#include <cstdint>

#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBr = 64, kBc = 64, kThreadsMma = 128;

__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                    __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                    __half) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <typename S>
__device__ __forceinline__ unsigned bits(S x) {
  return *reinterpret_cast<const unsigned short*>(&x);
}
// Two elements as one register, the first in the low half.
template <typename S>
__device__ __forceinline__ unsigned pair(S lo, S hi) {
  return bits(lo) | (bits(hi) << 16);
}
template <typename S>
__device__ __forceinline__ unsigned pack(float lo, float hi) {
  return pair(from_float<S>(lo), from_float<S>(hi));
}
template <typename S>
__device__ __forceinline__ unsigned ld32(const S* p) {
  return *reinterpret_cast<const unsigned*>(p);
}

// Rows r0..r0+63 of one part of a head (rows of stride `stride` from
// `src`) into `dst` (leading dimension LD), 8 elements (16 bytes) a load;
// rows at or past T are zeros.
template <typename S, int D, int LD>
__device__ void load_tile(S* dst, const S* src, i64 stride, i64 r0, i64 T) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < kBr * kChunks; c += kThreadsMma) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < T) v = *reinterpret_cast<const uint4*>(src + (r0 + r) * stride + col);
    *reinterpret_cast<uint4*>(dst + r * LD + col) = v;
  }
}

template <typename S, int D>
__global__ void __launch_bounds__(kThreadsMma)
    flash_forward_mma_kernel(const unsigned* fault, S* out, float* lse, const S* qkv, i64 T, i64 C,
                             i64 NH) {
  if (faulted(fault)) return;
  constexpr int LD = D + 8;  // padded rows: the fragments' loads spread over the banks
  extern __shared__ __align__(16) unsigned char smem[];
  S* Qs = reinterpret_cast<S*>(smem);
  S* Ks = Qs + kBr * LD;
  S* Vs = Ks + kBc * LD;
  // (Blocks go by x first: every head's last query block, the longest, first.)
  const i64 blocks = (T + kBr - 1) / kBr, qb = blocks - 1 - blockIdx.y;
  const i64 bh = blockIdx.x, b = bh / NH, h = bh % NH, C3 = 3 * C, q0 = qb * kBr;
  const S* base = qkv + b * T * C3 + h * D;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  load_tile<S, D, LD>(Qs, base, C3, q0, T);
  const float scale = rsqrtf(static_cast<float>(D));
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[D / 8][4] = {};
  for (i64 kb = 0; kb <= qb; kb++) {
    const i64 k0 = kb * kBc;
    __syncthreads();  // the last tile's K and V have been read (and Q is in)
    load_tile<S, D, LD>(Ks, base + C, C3, k0, T);
    load_tile<S, D, LD>(Vs, base + 2 * C, C3, k0, T);
    __syncthreads();
    float s[kBc / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      const S* qr = Qs + (warp * 16 + g) * LD + kk * 16 + 2 * t;
      const unsigned a[4] = {ld32(qr), ld32(qr + 8 * LD), ld32(qr + 8), ld32(qr + 8 * LD + 8)};
#pragma unroll
      for (int nt = 0; nt < kBc / 8; nt++) {
        const S* kr = Ks + (nt * 8 + g) * LD + kk * 16 + 2 * t;
        const unsigned bb[2] = {ld32(kr), ld32(kr + 8)};
        mma(s[nt], a, bb, S{});
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const i64 qi = q0 + warp * 16 + g + 8 * r;
      float mx = m[r];
#pragma unroll
      for (int nt = 0; nt < kBc / 8; nt++) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const i64 kj = k0 + nt * 8 + 2 * t + c;
          float v = s[nt][2 * r + c] * scale;
          if (kj > qi || kj >= T) v = -INFINITY;
          s[nt][2 * r + c] = v;
          mx = fmaxf(mx, v);
        }
      }
      // The 4 threads of a row: every row has a key at or before it in its
      // first tile, so mx is finite.
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float corr = expf(m[r] - mx);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kBc / 8; nt++) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const float p = expf(s[nt][2 * r + c] - mx);
          s[nt][2 * r + c] = p;
          sum += p;
        }
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[r] = l[r] * corr + sum;
      m[r] = mx;
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++) {
        o[dt][2 * r] *= corr;
        o[dt][2 * r + 1] *= corr;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBc / 16; kk++) {
      const unsigned a[4] = {
          pack<S>(s[2 * kk][0], s[2 * kk][1]), pack<S>(s[2 * kk][2], s[2 * kk][3]),
          pack<S>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack<S>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++) {
        const S* vr = Vs + (kk * 16 + 2 * t) * LD + dt * 8 + g;
        const unsigned bb[2] = {pair(vr[0], vr[LD]), pair(vr[8 * LD], vr[9 * LD])};
        mma(o[dt], a, bb, S{});
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const i64 qi = q0 + warp * 16 + g + 8 * r;
    if (qi >= T) continue;
    const float inv = 1.0f / l[r];
    S* y = out + (b * T + qi) * C + h * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
      y[dt * 8 + 2 * t] = from_float<S>(o[dt][2 * r] * inv);
      y[dt * 8 + 2 * t + 1] = from_float<S>(o[dt][2 * r + 1] * inv);
    }
    if (t == 0) lse[bh * T + qi] = m[r] + logf(l[r]);
  }
}

template <typename S, int D>
cudaError_t launch(const Launch& at, S* out, float* lse, const S* qkv, i64 B, i64 T, i64 C,
                   i64 NH) {
  constexpr int bytes = 3 * kBr * (D + 8) * static_cast<int>(sizeof(S));
  auto* kernel = flash_forward_mma_kernel<S, D>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  // x: the B*NH heads (up to 2^31 - 1), y: the query blocks (T up to 4M).
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>((T + kBr - 1) / kBr));
  kernel<<<grid, kThreadsMma, bytes, at.stream>>>(at.fault, out, lse, qkv, T, C, NH);
  return cudaGetLastError();
}

}  // namespace

bool flash_forward_mma_fits(Precision p, const void* qkv, i64 B, i64 T, i64 C, i64 NH) {
  const i64 HS = C / NH;
  return p != Precision::kFp32 && (HS == 64 || HS == 128) && C % 8 == 0 &&
         reinterpret_cast<std::uintptr_t>(qkv) % 16 == 0 && B * NH < (i64{1} << 31) &&
         (T + kBr - 1) / kBr <= 65535;
}

cudaError_t flash_forward_mma(const Launch& at, Precision p, void* out, float* lse, const void* qkv,
                              i64 B, i64 T, i64 C, i64 NH) {
  const i64 HS = C / NH;
  auto go = [&](auto tag) {
    using S = decltype(tag);
    S* y = static_cast<S*>(out);
    const S* x = static_cast<const S*>(qkv);
    return HS == 64 ? launch<S, 64>(at, y, lse, x, B, T, C, NH)
                    : launch<S, 128>(at, y, lse, x, B, T, C, NH);
  };
  return p == Precision::kBf16 ? go(__nv_bfloat16{}) : go(__half{});
}

}  // namespace troupe::gpu::cuda
