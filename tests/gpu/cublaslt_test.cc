// cuBLASLt opened on first use (gpu/cuda/cublaslt.h): the library loads, every
// entry resolves, and the table answers without a GPU. (That no executable
// links it is tests.cublaslt_not_linked, tests/CMakeLists.txt.)
#include "gpu/cuda/cublaslt.h"

#include <gtest/gtest.h>

#include <string>

namespace troupe::gpu::cuda {
namespace {

TEST(CublasLt, OpensAndResolvesEveryEntry) {
  absl::StatusOr<const CublasLt*> lt = load_cublaslt();
  ASSERT_TRUE(lt.ok()) << lt.status();
  const CublasLt& a = **lt;
  for (const void* f :
       {reinterpret_cast<const void*>(a.Create), reinterpret_cast<const void*>(a.Destroy),
        reinterpret_cast<const void*>(a.GetStatusName),
        reinterpret_cast<const void*>(a.GetStatusString), reinterpret_cast<const void*>(a.Matmul),
        reinterpret_cast<const void*>(a.MatmulAlgoGetHeuristic),
        reinterpret_cast<const void*>(a.MatmulDescCreate),
        reinterpret_cast<const void*>(a.MatmulDescDestroy),
        reinterpret_cast<const void*>(a.MatmulDescSetAttribute),
        reinterpret_cast<const void*>(a.MatmulPreferenceCreate),
        reinterpret_cast<const void*>(a.MatmulPreferenceDestroy),
        reinterpret_cast<const void*>(a.MatmulPreferenceSetAttribute),
        reinterpret_cast<const void*>(a.MatrixLayoutCreate),
        reinterpret_cast<const void*>(a.MatrixLayoutDestroy)}) {
    EXPECT_NE(f, nullptr);
  }
  EXPECT_EQ(std::string(a.GetStatusName(CUBLAS_STATUS_NOT_INITIALIZED)),
            "CUBLAS_STATUS_NOT_INITIALIZED");
  // A second load is the same table.
  absl::StatusOr<const CublasLt*> again = load_cublaslt();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lt);
}

}  // namespace
}  // namespace troupe::gpu::cuda
