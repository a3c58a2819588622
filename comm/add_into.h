// The one add of the CPU collectives (the Communicator's steps, the shared
// memory all-reduce).
#pragma once

#include <cstddef>

namespace troupe::comm {

// acc[i] = in[i] + acc[i]: the received partial sum first, always (the
// fixed order that makes every rank's result the same bits). One binary adds
// with AVX-512 or AVX2 where the CPU has them (4 MiB all-reduce at n=2:
// 6.4-7.7 GB/s busbw against 6.1-6.4 with SSE2 only); the sum of two floats
// is the same bits whatever the vector width.
void add_into(float* __restrict acc, const float* __restrict in, std::size_t n);

// acc[i] = in[i] + acc[i], and copy[i] the same: the two-member shared memory
// all-reduce's one pass (comm/shm_all_reduce.h).
void add_into_and_copy(float* __restrict acc, float* __restrict copy, const float* __restrict in,
                       std::size_t n);

}  // namespace troupe::comm
