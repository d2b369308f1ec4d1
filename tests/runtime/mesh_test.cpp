// Mesh: named axes made by Comm::split — coordinates in row-major order, each axis' members and
// order, collectives on one axis confined to it, and the errors for a mesh that does not fit.
#include <gtest/gtest.h>

#include <span>
#include <stdexcept>
#include <vector>

#include "test_util.hpp"
#include "tspemu/runtime/mesh.hpp"

namespace tspemu::test {
namespace {

TEST(MeshAxes, CoordinatesAreRowMajorAndEachAxisHoldsTheRanksSharingTheOthers) {
  World& world = shared_world(8);
  world.run([](Rank& r) {
    tspemu::Mesh mesh(r, {{"dp", 2}, {"sp", 2}, {"tp", 2}});
    const int dp = r.id() / 4, sp = (r.id() / 2) % 2, tp = r.id() % 2;
    EXPECT_EQ(mesh.coord("dp"), dp);
    EXPECT_EQ(mesh.coord("sp"), sp);
    EXPECT_EQ(mesh.coord("tp"), tp);
    EXPECT_EQ(mesh.describe(), "dp=2 × sp=2 × tp=2");
    // Each axis: its members differ from this rank in that coordinate only, ordered by it.
    const int stride[] = {4, 2, 1};
    const char* names[] = {"dp", "sp", "tp"};
    for (int a = 0; a < 3; ++a) {
      Comm& c = mesh.axis(names[a]);
      EXPECT_EQ(c.size(), 2);
      EXPECT_EQ(c.name(), names[a]);
      EXPECT_EQ(c.rank(), mesh.coord(names[a]));
      const int base = r.id() - mesh.coord(names[a]) * stride[a];
      for (int i = 0; i < 2; ++i) EXPECT_EQ(c.world_rank(i), base + i * stride[a]) << names[a];
    }
    // A sum over "sp" adds the two ranks of this (dp, tp) pair only.
    std::vector<std::int64_t> v{r.id()};
    all_reduce<std::int64_t>(mesh.axis("sp"), std::span<std::int64_t>(v));
    EXPECT_EQ(v[0], 2 * (r.id() - 2 * sp) + 2);
    EXPECT_THROW((void)mesh.axis("pp"), std::invalid_argument);
  });
}

TEST(MeshAxes, AMeshThatDoesNotFitTheGroupIsRefusedBeforeAnySplit) {
  World& world = shared_world(4);
  world.run([](Rank& r) {
    try {
      tspemu::Mesh mesh(r, {{"dp", 2}, {"sp", 3}});
      ADD_FAILURE() << "a 6-rank mesh on 4 ranks was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("dp=2 × sp=3 has 6 ranks"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(tspemu::Mesh(r, {{"sp", 2}, {"sp", 2}}), std::invalid_argument);
    EXPECT_THROW(tspemu::Mesh(r, {{"sp", 0}, {"tp", 4}}), std::invalid_argument);
    // One axis of every rank is the whole group, in its order.
    tspemu::Mesh flat(r, {{"tsp", 4}});
    EXPECT_EQ(flat.axis("tsp").rank(), r.id());
  });
}

}  // namespace
}  // namespace tspemu::test
