// The program of the tests of a World spanning MPI processes (WorldOptions::mpi,
// runtime/transport/mpi.hpp), run under `mpirun -np P`: every process runs every test; each
// compares its own ranks' results. Here: MPI initialized before any test, and the MpiWorld tests of
// every *_test.cpp of this folder instantiated at N = 4 and 8 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "mpi_world.hpp"

namespace tspemu::test {

INSTANTIATE_TEST_SUITE_P(Ranks, MpiWorld, ::testing::Values(4, 8),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

}  // namespace tspemu::test

// MPI is initialized here, before any test asks for the process count; the worlds then use it.
int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  MPI_Finalize();
  return failed;
}
