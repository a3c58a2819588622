// convert: out = in in out's storage (float, bf16, half), rounded to nearest
// even (gpu/precision.h's conversions: bf16/fp16 to fp32 is exact, fp32 to
// 16 bits rounds once, fp16 overflow gives inf, NaN stays NaN; bf16 <-> fp16
// goes through fp32, exactly, so it too rounds once). An elementwise map
// (elementwise.cuh): a thread owns 8 elements per step when a 16-bit type
// takes part (one Packed128 of it, two of fp32), moving n * (sizeof(in) +
// sizeof(out)) bytes. Equal storages are a bitwise copy, as the CPU's
// memmove (out == in: nothing to do; the caller keeps overlapping ones
// apart), by cudaMemcpyAsync, which like ops::copy does not look at the
// fault word. Op, then launcher.
#include "gpu/cuda/elementwise.cuh"

namespace troupe::gpu::cuda {
namespace {

struct Identity {  // the rounding is the map's store
  __device__ float operator()(float x) const { return x; }
};

}  // namespace

cudaError_t convert(const Launch& at, void* out, Precision to, const void* in, Precision from,
                    i64 n) {
  if (n == 0 || (to == from && out == in)) return cudaSuccess;
  if (to == from) {
    const std::size_t size = to == Precision::kFp32 ? sizeof(float) : sizeof(__half);
    return cudaMemcpyAsync(out, in, static_cast<std::size_t>(n) * size, cudaMemcpyDeviceToDevice,
                           at.stream);
  }
  return with_storage(to, [&](auto o) {
    return with_storage(from, [&](auto i) {
      using Out = typename decltype(o)::type;
      using In = typename decltype(i)::type;
      return launch_map(at, static_cast<Out*>(out), Inputs<In, 1>{{static_cast<const In*>(in)}}, n,
                        Identity{});
    });
  });
}

}  // namespace troupe::gpu::cuda
