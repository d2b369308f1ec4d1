// What every test of a World spanning MPI processes (tests/runtime/mpi/*_test.cpp) shares: the
// process count, inexact inputs, one rank's outputs gathered over a run, the spanning world's
// options, and the MpiWorld fixture (parameter: the rank count N; instantiated in main.cpp).
//
// Bitwise equality with one process: a test runs the same schedule in a world spanning the
// processes and in a threads-only world of the same N inside this process, and compares the
// outputs of the ranks this process hosts bit for bit. Those inputs are deliberately inexact
// (1/(k+1)): a sum taken in another order would differ in its last bits, so the comparison checks
// the rank order of every reduction, not only the data movement.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "tspemu/runtime/world.hpp"

namespace tspemu::test {

inline int processes() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

inline float inexact(int rank, std::size_t i, int salt) {
  return 1.0f / static_cast<float>(1 + rank * 131 + static_cast<int>(i % 1000) * 7 + salt * 3);
}

// One rank's outputs of every collective and its traffic counters, in a fixed order.
struct Outputs {
  std::vector<float> values;
  std::vector<std::uint64_t> counters;
};

inline std::vector<Outputs> run_outputs(World& w, const std::function<void(Rank&, Outputs&)>& fn) {
  std::vector<Outputs> outs(static_cast<std::size_t>(w.size()));
  w.clear_counters();
  w.run([&](Rank& r) { fn(r, outs[static_cast<std::size_t>(r.id())]); });
  return outs;
}

// A world of n ranks spanning the processes of the job.
inline WorldOptions across(int n) {
  return WorldOptions{.ranks = n, .hang_timeout = std::chrono::seconds(60), .mpi = true};
}

class MpiWorld : public ::testing::TestWithParam<int> {};

}  // namespace tspemu::test
