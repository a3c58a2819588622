#include "comm/add_into.h"

namespace troupe::comm {

// (Not under ThreadSanitizer: the clones' resolver runs before it is set up
// and crashes.)
#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void add_into(float* __restrict acc, const float* __restrict in, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) acc[i] = in[i] + acc[i];
}

#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void add_into_and_copy(float* __restrict acc, float* __restrict copy, const float* __restrict in,
                       std::size_t n) {
  for (std::size_t i = 0; i < n; i++) {
    const float sum = in[i] + acc[i];
    acc[i] = sum;
    copy[i] = sum;
  }
}

}  // namespace troupe::comm
