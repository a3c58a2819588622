// The anchor: OpenMPI's MPI_Allreduce (Debian's openmpi, shared memory on one
// host), same sizes, iteration counts and busbw as bench/comm_bench.cc.
//   mpirun -np N bench/comm_mpi [min_bytes max_bytes]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
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
