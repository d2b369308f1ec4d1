#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu {
namespace {

TEST(Smoke, AllGatherAndAllReduceProduceExactSums) {
  for (int n : {1, 2, 3, 8}) {
    World world({.ranks = n});
    for (std::size_t count :
         {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{1} << 16}) {
      world.run([&](Rank& r) {
        std::vector<float> x(count), g(count * n), s(count);
        for (std::size_t i = 0; i < count; ++i) x[i] = float(r.id() + 1) * float(i % 13);
        all_gather<float>(r.comm(), x, g);
        for (int q = 0; q < n; ++q)
          for (std::size_t i = 0; i < count; ++i)
            ASSERT_EQ(g[q * count + i], float(q + 1) * float(i % 13));
        all_reduce<float>(r.comm(), x, s);
        for (std::size_t i = 0; i < count; ++i)
          ASSERT_EQ(s[i], float(n * (n + 1) / 2) * float(i % 13));
        barrier(r.comm());
      });
    }
  }
}

}  // namespace
}  // namespace tspemu
