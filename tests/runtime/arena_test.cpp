// Arena: alignment, exact accounting (charged = round_up(n, 64)), categories, phases, the
// steady state without system allocations, OOM, Buffer move semantics.
#include "tspemu/runtime/arena.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tspemu/runtime/error.hpp"

namespace tspemu {
namespace {

constexpr std::size_t kCap = std::size_t{1} << 30;

TEST(Arena, EveryAllocationIs64ByteAligned) {
  Arena a(0, kCap);
  std::vector<Buffer<std::byte>> bufs;
  for (std::size_t n : {1, 3, 63, 64, 65, 100, 4095, 4097, 1 << 20})
    bufs.push_back(a.allocate<std::byte>(n, Category::other));
  auto d = a.allocate<double>(3, Category::workspace);
  for (auto& b : bufs) EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(d.data()) % 64, 0u);
}

TEST(Arena, CurrentPeakAndCategoriesAreChargedRoundedUpTo64) {
  Arena a(3, kCap);
  const auto w = static_cast<std::size_t>(Category::weights);
  const auto k = static_cast<std::size_t>(Category::kv);
  {
    auto x = a.allocate<float>(10, Category::weights);  // 40 -> 64
    EXPECT_EQ(a.stats().current, 64u);
    auto y = a.allocate<double>(100, Category::kv);  // 800 -> 832
    EXPECT_EQ(a.stats().current, 64u + 832u);
    EXPECT_EQ(a.stats().category_current[w], 64u);
    EXPECT_EQ(a.stats().category_current[k], 832u);
    {
      auto z = a.allocate<std::byte>(64, Category::kv);  // exactly 64
      EXPECT_EQ(a.stats().current, 64u + 832u + 64u);
      EXPECT_EQ(a.stats().category_current[k], 896u);
    }
    EXPECT_EQ(a.stats().current, 64u + 832u);
    EXPECT_EQ(a.stats().peak, 960u);
    EXPECT_EQ(a.stats().category_peak[k], 896u);
    auto empty = a.allocate<float>(0, Category::other);
    EXPECT_TRUE(empty.empty());
    EXPECT_EQ(a.stats().current, 896u);
  }
  EXPECT_EQ(a.stats().current, 0u);
  EXPECT_EQ(a.stats().peak, 960u);
  EXPECT_EQ(a.stats().category_current[w], 0u);
  EXPECT_EQ(a.stats().category_peak[w], 64u);
  EXPECT_EQ(a.stats().allocations, 4u);
  a.reset_peaks();
  EXPECT_EQ(a.stats().peak, 0u);
  EXPECT_EQ(a.stats().category_peak[k], 0u);
}

TEST(Arena, KvCacheIsItsOwnCategoryApartFromTransientKvAndEveryCategoryHasADistinctName) {
  Arena a(0, kCap);
  const auto k = static_cast<std::size_t>(Category::kv);
  const auto c = static_cast<std::size_t>(Category::kv_cache);
  {
    auto cache = a.allocate<float>(100, Category::kv_cache);  // 400 -> 448
    auto gathered = a.allocate<float>(16, Category::kv);      // 64
    EXPECT_EQ(a.stats().category_current[c], 448u);
    EXPECT_EQ(a.stats().category_current[k], 64u);
  }
  EXPECT_EQ(a.stats().category_peak[c], 448u);
  EXPECT_EQ(std::string(category_name(Category::kv_cache)), "kv_cache");
  std::vector<std::string> names;
  for (std::size_t i = 0; i < kCategoryCount; ++i) {
    names.emplace_back(category_name(static_cast<Category>(i)));
    EXPECT_NE(names.back(), "?") << "category " << i << " has no name";
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << "duplicate name";
}

TEST(Arena, PhasePeaksAreRecordedPerNameAndNest) {
  Arena a(0, kCap);
  auto base = a.allocate<std::byte>(1000, Category::weights);  // 1024
  {
    auto attn = a.phase("attention");
    auto t = a.allocate<std::byte>(4096, Category::workspace);
    {
      auto inner = a.phase("softmax");
      auto u = a.allocate<std::byte>(100, Category::workspace);  // 128
    }
    auto v = a.allocate<std::byte>(64, Category::workspace);
  }
  {
    auto mlp = a.phase("mlp");
    auto t = a.allocate<std::byte>(2048, Category::activations);
  }
  {
    auto attn = a.phase("attention");  // entered again: keeps the max
    auto t = a.allocate<std::byte>(64, Category::workspace);
  }
  EXPECT_EQ(a.phase_peak("attention"), 1024u + 4096u + 128u);
  EXPECT_EQ(a.phase_peak("softmax"), 1024u + 4096u + 128u);
  EXPECT_EQ(a.phase_peak("mlp"), 1024u + 2048u);
  EXPECT_EQ(a.phase_peak("never"), 0u);
  EXPECT_EQ(a.phase_peaks().size(), 3u);
  {
    auto after = a.phase("late");  // a phase entered with memory in use starts at the current use
  }
  EXPECT_EQ(a.phase_peak("late"), 1024u);
  // Allocations outside any phase do not raise phase peaks.
  auto big = a.allocate<std::byte>(1 << 20, Category::other);
  EXPECT_EQ(a.phase_peak("mlp"), 1024u + 2048u);
}

TEST(Arena, RepeatedAllocationPatternMakesNoSystemAllocationAfterTheFirstIteration) {
  Arena a(0, kCap);
  std::size_t after_first = 0;
  for (int it = 0; it < 50; ++it) {
    auto w = a.allocate<float>(1000, Category::weights);
    auto x = a.allocate<double>(333, Category::activations);
    {
      auto t1 = a.allocate<std::byte>(5000, Category::workspace);
      auto t2 = a.allocate<std::byte>(5000, Category::workspace);
    }
    auto t3 = a.allocate<std::byte>(4993, Category::comm);  // charged 5056 like t1: reused
    if (it == 0) after_first = a.stats().system_allocations;
  }
  EXPECT_EQ(after_first, 4u);
  EXPECT_EQ(a.stats().system_allocations, after_first);
  EXPECT_EQ(a.stats().allocations, 250u);
  EXPECT_EQ(a.stats().current, 0u);
  a.trim();
  auto again = a.allocate<float>(1000, Category::weights);
  EXPECT_EQ(a.stats().system_allocations, after_first + 1);
}

TEST(Arena, FreeBlockCacheStaysWithinTwiceTheMostEverLiveUnderEverChangingSizes) {
  // 10,000 allocations of distinct sizes, at most two live at once (< 64 KiB): without a bound
  // the cache would keep every freed block (about 330 MB).
  Arena a(0, kCap);
  std::size_t most_live = 0;
  for (std::size_t i = 0; i < 10000; ++i) {
    auto x = a.allocate<std::byte>(64 * (i % 500 + 1) + i, Category::workspace);
    auto y = a.allocate<std::byte>(100 + i, Category::workspace);
    most_live = std::max(most_live, a.stats().current);
  }
  EXPECT_LE(a.stats().cached, 2 * most_live);
  EXPECT_GT(a.stats().cached, 0u) << "the cache should still keep blocks";
  a.trim();
  EXPECT_EQ(a.stats().cached, 0u);
}

TEST(Arena, ZeroedAllocationIsZero) {
  Arena a(0, kCap);
  {
    auto d = a.allocate<std::int32_t>(100, Category::other);
    for (auto& x : d) x = -1;
  }
  auto z = a.allocate<std::int32_t>(100, Category::other, /*zero=*/true);  // reuses the block
  EXPECT_EQ(a.stats().system_allocations, 1u);
  for (auto x : z) EXPECT_EQ(x, 0);
}

TEST(Arena, ExceedingCapacityThrowsOutOfMemoryWithDetails) {
  Arena a(5, 10000);
  auto w = a.allocate<std::byte>(6000, Category::weights);  // 6016
  auto k = a.allocate<std::byte>(2000, Category::kv);       // 2048
  try {
    auto more = a.allocate<std::byte>(3000, Category::activations);
    FAIL() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    for (const char* part : {"rank 5", "2.93 KiB", "activations", "capacity 9.77 KiB",
                             "in use 7.88 KiB", "weights 5.88 KiB", "kv 2.00 KiB"})
      EXPECT_NE(m.find(part), std::string::npos) << m << " lacks " << part;
  }
  EXPECT_EQ(a.stats().current, 6016u + 2048u);               // the failed request is not charged
  auto fits = a.allocate<std::byte>(1920, Category::other);  // charged 1920: 9984 in use
  EXPECT_EQ(a.stats().current, 9984u);
  EXPECT_THROW(auto one = a.allocate<std::byte>(1, Category::other), OutOfMemory);
  a.set_capacity(20000);
  auto now_fits = a.allocate<std::byte>(1, Category::other);
}

TEST(Arena, HugeRequestsThatWouldOverflowAreOutOfMemory) {
  Arena a(0, kCap);
  const std::size_t max = static_cast<std::size_t>(-1);
  EXPECT_THROW(auto b = a.allocate<double>(max / 4, Category::other), OutOfMemory);
  EXPECT_THROW(auto b = a.allocate<std::byte>(max - 10, Category::other), OutOfMemory);
  EXPECT_THROW(auto b = a.allocate<float>(max / 4 + 1, Category::other), OutOfMemory);
  EXPECT_EQ(a.stats().current, 0u);
  EXPECT_EQ(a.stats().system_allocations, 0u);
}

TEST(Arena, BufferMovesTransferOwnershipAndReleaseOnce) {
  Arena a(0, kCap);
  auto x = a.allocate<float>(16, Category::weights);
  float* p = x.data();
  x[3] = 2.5f;
  Buffer<float> y(std::move(x));
  EXPECT_EQ(y.data(), p);
  EXPECT_EQ(y.size(), 16u);
  EXPECT_EQ(x.data(), nullptr);
  EXPECT_TRUE(x.empty());
  EXPECT_EQ(y[3], 2.5f);
  Buffer<float> z = a.allocate<float>(32, Category::kv);
  EXPECT_EQ(a.stats().current, 64u + 128u);
  z = std::move(y);  // z's old block is released
  EXPECT_EQ(a.stats().current, 64u);
  EXPECT_EQ(z.data(), p);
  EXPECT_EQ(a.stats().category_current[static_cast<std::size_t>(Category::kv)], 0u);
  Buffer<float>& alias = z;
  z = std::move(alias);  // self-move keeps the buffer
  EXPECT_EQ(z.data(), p);
  z.reset();
  EXPECT_EQ(a.stats().current, 0u);
  z.reset();  // idempotent
  EXPECT_EQ(a.stats().current, 0u);
  std::span<const float> view = std::as_const(z);
  EXPECT_TRUE(view.empty());
}

TEST(Arena, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(std::size_t{3} << 30), "3.00 GiB");
}

}  // namespace
}  // namespace tspemu
