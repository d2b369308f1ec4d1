// The memory a run needs (run_memory.hpp): runs that cannot fit are refused before allocating,
// naming GiB per rank and in total; the need is a lower bound of what the run allocates.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cli_outcome.hpp"
#include "problem_options.hpp"
#include "run_memory.hpp"
#include "selfcheck.hpp"

namespace tspemu::app {
namespace {

using namespace testing;  // cli_outcome.hpp

TEST(Cli, RunsThatCannotFitInMemoryAreRefusedBeforeAllocatingNamingGiBPerRankAndTotal) {
  // Each would grow to the machine's limit and die of std::bad_alloc if run.
  const std::vector<std::vector<std::string>> cases = {
      {"run", "--hidden", "65536", "--seq", "1048576", "-q"},
      {"run", "--layers", "100000", "-q"},
      {"run", "--strategy", "tp", "--layers", "100000", "--no-check", "-q"},
      {"compare", "--layers", "100000", "-q"},
      {"scale", "--layers", "100000", "--max-ranks", "2", "-q"},
  };
  for (const auto& args : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const Outcome o = tspemu(args);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(o.code, 2) << args[0] << " " << args[1] << "\n" << o.err;
    for (const char* part :
         {"invalid configuration: memory: ", " per rank (arena capacity 16.00 GiB)", " in total (",
          " available, MemAvailable in /proc/meminfo"})
      EXPECT_NE(o.err.find(part), std::string::npos) << part << "\n" << o.err;
    EXPECT_LT(took, 2.0) << "the check must be cheap: " << o.err;
  }
}

// selfcheck gets run's pre-check: --count x --ranks past a rank's arena or the machine is refused
// naming both flags, exit 2, before any rank allocates; train --layers was the case.
TEST(Cli, SelfcheckAndTrainThatCannotFitAreRefusedNamingTheFlags) {
  const auto t0 = std::chrono::steady_clock::now();
  Outcome o = tspemu({"selfcheck", "--ranks", "256", "--count", "16777216"});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("selfcheck --count 16777216 --ranks 256 needs at least 32.00 GiB per rank"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("a rank's arena exceeds its capacity; lower --count or --ranks"),
            std::string::npos)
      << o.err;
  o = tspemu({"train", "--layers", "100000", "-q"});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("memory: train TSP D=4 needs at least"), std::string::npos) << o.err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));

  const SelfcheckOptions fits{.ranks = 4, .count = 1 << 16};
  EXPECT_EQ(selfcheck_rank_bytes(fits), 2u * 4 * (1 << 16) * 4);
  EXPECT_NO_THROW(require_selfcheck_memory(fits, selfcheck_rank_bytes(fits) * 4, 1 << 30));
  try {
    require_selfcheck_memory(fits, selfcheck_rank_bytes(fits) * 4 - 1, 1 << 30);
    ADD_FAILURE() << "accepted a selfcheck past the available memory";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("more than the machine's available memory"),
              std::string::npos)
        << e.what();
  }
}

TEST(Cli, RunMemoryIsALowerBoundOfWhatTheRunAllocatesAndRefusesPastTheArenaCapacity) {
  ProblemOptions p;
  p.model.n_layers = 2;
  p.S = 256;
  for (const char* strategy : {"tsp", "tp", "sp"}) {
    p.strategy = strategy;
    StackConfig c = make_stack_config(p, parse_strategy(p));
    const RunMemory need = require_run_memory(c, false, strategy, UINT64_MAX, std::size_t{1} << 40);
    const StackResult r = run_stack(c);
    ASSERT_EQ(need.rank.size(), r.ranks.size());
    for (std::size_t i = 0; i < r.ranks.size(); ++i) {
      // The run's arena peak counts from after construction plus what was resident then.
      EXPECT_LE(need.rank[i], r.ranks[i].arena.peak) << strategy << " rank " << i;
      // ... and not a useless one: at least a quarter of it.
      EXPECT_GE(need.rank[i], r.ranks[i].arena.peak / 4) << strategy << " rank " << i;
    }
    EXPECT_GT(need.host, 0u);
    try {
      require_run_memory(c, false, strategy, UINT64_MAX, need.max_rank() - 1);
      ADD_FAILURE() << strategy << ": accepted a capacity below its need";
    } catch (const ConfigError& e) {
      // Refused by the stack's total or by the dry layer itself, both against the capacity.
      const std::string what = e.what();
      EXPECT_TRUE(what.find("a rank's arena exceeds its capacity") != std::string::npos ||
                  what.find("one layer alone does not fit in a rank's arena") != std::string::npos)
          << what;
    }
    EXPECT_THROW(require_run_memory(c, false, strategy, need.total() - 1, std::size_t{1} << 40),
                 ConfigError);
  }
}

}  // namespace
}  // namespace tspemu::app
