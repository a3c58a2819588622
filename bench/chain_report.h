// What bench/comm_bench.cc, comm_mpi.cc and comm_gloo.cc print for their
// `chain` (a pipeline's hops, for bench/hop_bench.py): the median of the
// steps' seconds after the first 50 (or half), as one JSON line, from rank 0.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <vector>

inline void print_chain_step(const char* impl, int size, std::size_t bytes,
                             std::vector<double> seconds) {
  const auto skip = std::min<std::size_t>(50, seconds.size() / 2);
  std::sort(seconds.begin() + static_cast<std::ptrdiff_t>(skip), seconds.end());
  const double median = seconds[skip + (seconds.size() - skip) / 2];
  std::printf(
      "{\"impl\": \"%s\", \"op\": \"chain\", \"n\": %d, \"bytes\": %zu, \"step_us\": %.3f}\n", impl,
      size, bytes, median * 1e6);
  std::fflush(stdout);
}
