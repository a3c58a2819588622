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

}  // namespace troupe::comm
