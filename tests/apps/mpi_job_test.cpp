// The command launched by mpirun (mpi_job.hpp), without a real mpirun: the commands that cannot
// span processes refuse instead of running independent copies. Under a real mpirun:
// tests/apps/mpi/cli_under_mpirun.sh.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cli_outcome.hpp"

namespace tspemu::app {
namespace {

using namespace testing;  // cli_outcome.hpp

// Under mpirun with several processes, the commands that do not span processes refuse (exit 2,
// naming the process count) instead of running P independent copies, and so does a run whose
// ranks the processes do not divide, before any world is made; plan (no ranks) still works.
// (Spanning runs: tests/apps/mpi/cli_under_mpirun.sh under a real mpirun.)
TEST(Cli, CommandsThatCannotSpanMpirunProcessesRefuseInsteadOfRunningIndependentCopies) {
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"selfcheck"},
                                             {"train"},
                                             {"paper"},
                                             {"run", "--ranks", "3"},
                                             {"compare", "--ranks", "3"}}) {
    const Outcome o = tspemu(args);
    EXPECT_EQ(o.code, 2) << args[0];
    EXPECT_NE(o.err.find("launched by mpirun with 2 processes"), std::string::npos)
        << args[0] << ": " << o.err;
  }
  const Outcome plan = tspemu({"plan", "paper-7b", "--seq", "16K"});
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(plan.code, 0) << plan.err;
}

}  // namespace
}  // namespace tspemu::app
