// cuBLASLt, opened on first use. A process that links libcublasLt runs its
// static initialisers at start, about 0.3 s of CPU, whether or not it ever
// touches a GPU: every `troupe` command, every worker a launch starts and
// every test process. troupe opens the library with dlopen when the first
// CUDA device is made (CudaDevice::init) and calls it through this table.
#pragma once

#include <cublasLt.h>

#include "absl/status/statusor.h"

namespace troupe::gpu::cuda {

// The cuBLASLt entry points troupe calls (the names without `cublasLt`).
struct CublasLt {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtDestroy) Destroy;
  decltype(&::cublasLtGetStatusName) GetStatusName;
  decltype(&::cublasLtGetStatusString) GetStatusString;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
};

// Opens libcublasLt.so.<the major version troupe was compiled against> once
// per process (thread-safe) and resolves the table; an error names the
// library and says why it could not be opened or what it lacks. The device
// keeps the table and hands it to its streams' GEMMs (Gemm::api).
absl::StatusOr<const CublasLt*> load_cublaslt();

}  // namespace troupe::gpu::cuda
