// The index check of the ops that read ids (embedding's tokens, the loss's
// targets): an id outside [0, bound) raises the op's fault. Kernel, then
// launcher.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void check_indices_kernel(unsigned* fault, Fault code, const std::int32_t* ids, i64 n,
                                     i64 bound) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    if (ids[i] < 0 || ids[i] >= bound) raise_fault(fault, code, bound);
  }
}

}  // namespace

cudaError_t check_indices(const Launch& at, Fault code, const std::int32_t* ids, i64 n, i64 bound) {
  if (n == 0) return cudaSuccess;
  check_indices_kernel<<<grid_for(n, kBlock), kBlock, 0, at.stream>>>(at.fault, code, ids, n,
                                                                      bound);
  return cudaGetLastError();
}

const char* fault_op(Fault f) {
  switch (f) {
    case Fault::kEmbeddingForwardToken:
      return "embedding_forward";
    case Fault::kEmbeddingBackwardToken:
      return "embedding_backward";
    case Fault::kCrossEntropyForwardTarget:
      return "crossentropy_forward";
    case Fault::kCrossEntropyBackwardTarget:
      return "crossentropy_backward";
    case Fault::kCrossEntropyPartialTarget:
      return "crossentropy_partial";
    case Fault::kNone:
      break;
  }
  return "an op";
}

const char* fault_what(Fault f) {
  switch (f) {
    case Fault::kEmbeddingForwardToken:
    case Fault::kEmbeddingBackwardToken:
      return "a token id";
    case Fault::kCrossEntropyForwardTarget:
    case Fault::kCrossEntropyBackwardTarget:
    case Fault::kCrossEntropyPartialTarget:
      return "a target";
    case Fault::kNone:
      break;
  }
  return "an index";
}

}  // namespace troupe::gpu::cuda
