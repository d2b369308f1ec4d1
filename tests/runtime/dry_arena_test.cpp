// Dry arena (arena.hpp, WorldOptions::dry_run): the accounting of a real arena without the
// memory, and a schedule that touches dry memory is caught with a message, not silently slow.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/runtime/all_reduce.hpp"
#include "tspemu/runtime/arena.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu {
namespace {

// The process's resident memory now (/proc/self/statm), bytes.
std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

// The same allocation pattern on a real and a dry arena.
ArenaStats run_pattern(Arena& a) {
  auto w = a.allocate<float>(1000, Category::weights);
  {
    auto ph = a.phase("step");
    auto x = a.allocate<double>(77, Category::activations, /*zero=*/true);
    auto y = a.allocate<std::byte>(1, Category::kv);
    auto z = a.allocate<float>(4096, Category::workspace);
  }
  auto k = a.allocate<std::int64_t>(3, Category::other);
  return a.stats();
}

TEST(DryArena, AccountsExactlyAsARealArena) {
  Arena real(0, std::size_t{1} << 30);
  Arena dry(0, std::size_t{1} << 30, /*dry=*/true);
  const ArenaStats r = run_pattern(real), d = run_pattern(dry);
  EXPECT_EQ(d.current, r.current);
  EXPECT_EQ(d.peak, r.peak);
  EXPECT_EQ(d.category_current, r.category_current);
  EXPECT_EQ(d.category_peak, r.category_peak);
  EXPECT_EQ(d.allocations, r.allocations);
  EXPECT_EQ(dry.phase_peak("step"), real.phase_peak("step"));
}

TEST(DryArena, HandsOutDistinctAlignedAddressesForTensOfGigabytesWithoutMemory) {
  const std::size_t before = resident_bytes();
  // 32 GiB: within the smallest reservation a sanitizer leaves room for (64 GiB).
  Arena dry(1, std::size_t{1} << 40, /*dry=*/true);
  std::vector<Buffer<float>> held;
  std::set<std::uintptr_t> seen;
  for (int i = 0; i < 8; ++i) {
    held.push_back(dry.allocate<float>(std::size_t{1} << 30, Category::activations));  // 4 GiB
    const auto a = reinterpret_cast<std::uintptr_t>(held.back().data());
    EXPECT_EQ(a % Arena::kAlignment, 0u);
    EXPECT_TRUE(seen.insert(a).second);
  }
  EXPECT_EQ(dry.stats().current, std::size_t{8} << 32);
  EXPECT_LT(resident_bytes(), before + (std::size_t{64} << 20))
      << "32 GiB of dry buffers must cost no memory";
}

TEST(DryArena, ExceedingTheCapacityIsOutOfMemoryAsInARealArena) {
  Arena dry(2, std::size_t{1} << 20, /*dry=*/true);
  auto a = dry.allocate<std::byte>(std::size_t{1} << 19, Category::kv);
  EXPECT_THROW(dry.allocate<std::byte>((std::size_t{1} << 19) + 1, Category::kv), OutOfMemory);
}

TEST(DryArena, RankThreadsOfADryWorldSeeDryRunAndCollectivesStillCountBytes) {
  World world({.ranks = 3, .dry_run = true});
  std::vector<int> dry(3, 0);
  world.run([&](Rank& r) {
    dry[static_cast<std::size_t>(r.id())] = dry_run() && r.arena().dry() ? 1 : 0;
    auto x = r.arena().allocate<float>(std::size_t{1} << 28, Category::comm);  // 1 GiB
    all_reduce<float>(r.comm(), x.span());
  });
  EXPECT_FALSE(dry_run()) << "the caller's thread is not dry";
  EXPECT_EQ(dry, (std::vector<int>{1, 1, 1}));
  for (int r = 0; r < 3; ++r) {
    const auto& k = world.counters(r).by_kind[static_cast<std::size_t>(CollectiveKind::all_reduce)];
    EXPECT_EQ(k.calls, 1u);
    EXPECT_GT(k.bytes_received, std::size_t{1} << 29);
  }
}

TEST(DryArenaDeathTest, AScheduleThatTouchesMemoryInDryModeIsCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        World world({.ranks = 2, .dry_run = true});
        world.run([](Rank& r) {
          auto x = r.arena().allocate<float>(1024, Category::workspace);
          x[17] = 1.0f;  // a copy that forgot its dry_run() test
        });
      },
      ::testing::ExitedWithCode(3),
      "dry run: rank code touched dry-run memory at 0x[0-9a-f]+; a kernel or copy is missing its "
      "dry_run\\(\\) check");
}

TEST(DryArenaDeathTest, AFaultOutsideDryMemoryStillCrashesAsBefore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Arena dry(0, 1024, /*dry=*/true);
  auto x = dry.allocate<float>(4, Category::other);  // installs the fault handler
  EXPECT_DEATH(
      {
        volatile int* p = nullptr;
        *p = 1;
      },
      "");
}

}  // namespace
}  // namespace tspemu
