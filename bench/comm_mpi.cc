// The anchor: OpenMPI's MPI_Allreduce (Debian's openmpi, shared memory on one
// host), same sizes, iteration counts and busbw as bench/comm_bench.cc. With
// `chain`, a pipeline's hops instead (bench/hop_bench.py): a step passes
// BYTES from rank 0 down to rank N-1 and back, each rank waiting for its
// input before it sends on, as a pipeline of ops that cost nothing (the
// receives posted first, the sends waited for at the step's end); prints
// the median step.
//   mpirun -np N bench/comm_mpi [min_bytes max_bytes]
//   mpirun -np N bench/comm_mpi chain BYTES STEPS
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "chain_report.h"

namespace {

void chain(int rank, int size, std::size_t bytes, int steps) {
  std::vector<char> act(bytes), grad(bytes);
  const int n = static_cast<int>(bytes);
  std::vector<double> t(static_cast<std::size_t>(steps));
  MPI_Barrier(MPI_COMM_WORLD);
  for (int s = 0; s < steps; s++) {
    const double t0 = MPI_Wtime();
    // The receives first, as a pipeline stage posts them; the sends waited
    // for at the step's end, before the buffers are used again.
    MPI_Request got_act = MPI_REQUEST_NULL, got_grad = MPI_REQUEST_NULL;
    MPI_Request sent[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (rank > 0) MPI_Irecv(act.data(), n, MPI_CHAR, rank - 1, 0, MPI_COMM_WORLD, &got_act);
    if (rank < size - 1)
      MPI_Irecv(grad.data(), n, MPI_CHAR, rank + 1, 1, MPI_COMM_WORLD, &got_grad);
    if (rank > 0) MPI_Wait(&got_act, MPI_STATUS_IGNORE);
    if (rank < size - 1) {
      MPI_Isend(act.data(), n, MPI_CHAR, rank + 1, 0, MPI_COMM_WORLD, &sent[0]);
      MPI_Wait(&got_grad, MPI_STATUS_IGNORE);
    }
    if (rank > 0) MPI_Isend(grad.data(), n, MPI_CHAR, rank - 1, 1, MPI_COMM_WORLD, &sent[1]);
    MPI_Waitall(2, sent, MPI_STATUSES_IGNORE);
    t[static_cast<std::size_t>(s)] = MPI_Wtime() - t0;
  }
  // (rank 0's step spans the others')
  if (rank == 0) print_chain_step("openmpi", size, bytes, std::move(t));
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc > 3 && std::strcmp(argv[1], "chain") == 0) {
    chain(rank, size, std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]));
    MPI_Finalize();
    return 0;
  }
  const std::size_t min_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4096;
  const std::size_t max_bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (256u << 20);
  std::vector<float> x(max_bytes / 4, 1.0f);
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const int n = static_cast<int>(bytes / 4);
    const int iters = static_cast<int>(std::clamp<std::size_t>((512u << 20) / bytes, 3, 2000));
    MPI_Allreduce(MPI_IN_PLACE, x.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
      MPI_Allreduce(MPI_IN_PLACE, x.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double per = (MPI_Wtime() - t0) / iters;
    if (rank == 0) {
      const double busbw = static_cast<double>(bytes) / per * 2.0 * (size - 1) / size / 1e9;
      std::printf(
          "{\"impl\": \"openmpi\", \"op\": \"allreduce\", \"n\": %d, \"bytes\": %zu, \"time_us\": "
          "%.3f, "
          "\"busbw_GBps\": %.4f}\n",
          size, bytes, per * 1e6, busbw);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
