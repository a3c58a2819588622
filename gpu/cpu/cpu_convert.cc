// Widening, rounding and the staging buffers of gpu/cpu/cpu_convert.h.
#include "gpu/cpu/cpu_convert.h"

#include <cstring>
#include <memory>
#include <new>

#include "gpu/cpu/vec_math.h"
#include "gpu/precision.h"

namespace troupe::gpu::cpu {
namespace {

TROUPE_CLONES void bf16_to_f32_range(float* out, const std::uint16_t* in, i64 i0, i64 i1) {
  for (i64 i = i0; i < i1; i++) out[i] = bf16_to_f32(in[i]);
}
TROUPE_CLONES void f16_to_f32_range(float* out, const std::uint16_t* in, i64 i0, i64 i1) {
  for (i64 i = i0; i < i1; i++) out[i] = f16_to_f32(in[i]);
}
TROUPE_CLONES void f32_to_bf16_range(std::uint16_t* out, const float* in, i64 i0, i64 i1) {
  for (i64 i = i0; i < i1; i++) out[i] = f32_to_bf16(in[i]);
}
TROUPE_CLONES void f32_to_f16_range(std::uint16_t* out, const float* in, i64 i0, i64 i1) {
  for (i64 i = i0; i < i1; i++) out[i] = f32_to_f16(in[i]);
}

// The calling thread's staging memory: one block, reused op after op, as
// large as the most one op has taken. An op that needs more takes extra
// blocks; when it ends they go, and the block grows to what it took.
// 64-byte aligned blocks: oneDNN's GEMMs may take another path, and sum in
// another order, for another alignment, and the allocator's alignment
// differs from process to process (under ASan too); the device's tensors
// are 64-byte aligned, and so are the staged copies.
struct AlignedFree {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using Block = std::unique_ptr<float[], AlignedFree>;
Block aligned_floats(i64 n) {
  return Block(static_cast<float*>(
      ::operator new[](static_cast<std::size_t>(n) * sizeof(float), std::align_val_t{64})));
}
struct Arena {
  Block block;
  i64 size = 0;   // floats in block
  i64 used = 0;   // of block, by the op in progress
  i64 taken = 0;  // by the op in progress, extras included
  int depth = 0;  // Stagings alive (nested)
  std::vector<Block> extra;
};
thread_local Arena arena;

}  // namespace

void widen(float* out, const void* in, DType from, i64 n) {
  const auto* h = static_cast<const std::uint16_t*>(in);
  switch (from) {
    case DType::kBF16:
      for_chunks(n, [&](i64 i0, i64 i1) { bf16_to_f32_range(out, h, i0, i1); });
      return;
    case DType::kF16:
      for_chunks(n, [&](i64 i0, i64 i1) { f16_to_f32_range(out, h, i0, i1); });
      return;
    default:
      if (out != in) std::memcpy(out, in, static_cast<std::size_t>(n) * sizeof(float));
  }
}

void narrow(void* out, DType to, const float* in, i64 n) {
  auto* h = static_cast<std::uint16_t*>(out);
  switch (to) {
    case DType::kBF16:
      for_chunks(n, [&](i64 i0, i64 i1) { f32_to_bf16_range(h, in, i0, i1); });
      return;
    case DType::kF16:
      for_chunks(n, [&](i64 i0, i64 i1) { f32_to_f16_range(h, in, i0, i1); });
      return;
    default:
      if (out != in) std::memcpy(out, in, static_cast<std::size_t>(n) * sizeof(float));
  }
}

void convert(void* out, DType to, const void* in, DType from, i64 n) {
  if (to == from) {
    if (out != in) std::memmove(out, in, static_cast<std::size_t>(n) * dtype_size(to));
  } else if (from == DType::kF32) {
    narrow(out, to, static_cast<const float*>(in), n);
  } else if (to == DType::kF32) {
    widen(static_cast<float*>(out), in, from, n);
  } else {  // bf16 <-> f16, through fp32 a chunk at a time
    const auto* src = static_cast<const std::uint16_t*>(in);
    auto* dst = static_cast<std::uint16_t*>(out);
    for_chunks(n, [&](i64 i0, i64 i1) {
      float tmp[kChunk];
      if (from == DType::kBF16) {
        bf16_to_f32_range(tmp, src + i0, 0, i1 - i0);
        f32_to_f16_range(dst + i0, tmp, 0, i1 - i0);
      } else {
        f16_to_f32_range(tmp, src + i0, 0, i1 - i0);
        f32_to_bf16_range(dst + i0, tmp, 0, i1 - i0);
      }
    });
  }
}

Staging::Staging() : first_(arena.used) { arena.depth++; }

Staging::~Staging() {
  arena.used = first_;
  if (--arena.depth > 0) return;  // (an enclosing Staging is still using it)
  if (!arena.extra.empty()) {
    arena.extra.clear();
    arena.block = aligned_floats(arena.taken);
    arena.size = arena.taken;
  }
  arena.taken = 0;
}

float* Staging::take(i64 n) {
  n = (n + 15) / 16 * 16;  // 64-byte aligned starts
  arena.taken += n;
  if (arena.used + n <= arena.size) {
    float* p = arena.block.get() + arena.used;
    arena.used += n;
    return p;
  }
  arena.extra.push_back(aligned_floats(n));
  return arena.extra.back().get();
}

const float* Staging::in(const Tensor& t) {
  if (!t.defined()) return nullptr;
  if (t.dtype == DType::kF32) return t.data<float>();
  float* f = take(t.numel());
  widen(f, t.raw(), t.dtype, t.numel());
  return f;
}

float* Staging::out(const Tensor& t) {
  if (!t.defined()) return nullptr;
  if (t.dtype == DType::kF32) return t.data<float>();
  float* f = take(t.numel());
  outs_.emplace_back(t, f);
  return f;
}

float* Staging::inout(const Tensor& t) {
  float* f = out(t);
  if (f != nullptr && t.dtype != DType::kF32) widen(f, t.raw(), t.dtype, t.numel());
  return f;
}

void Staging::commit() {
  for (const auto& [t, f] : outs_) narrow(t.raw(), t.dtype, f, t.numel());
  outs_.clear();
}

}  // namespace troupe::gpu::cpu
