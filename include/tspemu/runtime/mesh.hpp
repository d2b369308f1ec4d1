// Mesh: named axes of a group of ranks, each axis a Comm made by Comm::split.
//
// What: Mesh mesh(rank, {{"dp", 2}, {"sp", 2}, {"tp", 2}}) places the group's ranks on a grid in
// row-major order, the last axis varying fastest (group rank = (c0·s1 + c1)·s2 + c2, so the
// innermost axis is a run of consecutive ranks, like Megatron's tensor-parallel groups).
// mesh.axis("sp") is the Comm of the ranks that share every other coordinate, ordered by their
// "sp" coordinate (mesh.axis("sp").rank() == mesh.coord("sp")); the Comm is named after the axis
// ("sp"), so error messages and traces say which axis a collective ran on.
// Requirements: collective over `parent` (every member constructs the same mesh, in the same
// order as its other collectives on parent); axis names distinct and non-empty, sizes >= 1, their
// product equal to parent.size() — otherwise std::invalid_argument naming the axes and the
// group's size, before any split. A Mesh is used by its rank's thread only, like its Comms.
// Guarantees: one Comm::split per axis, in the order given; collectives on different axes never
// interfere (each Comm has its own sequence numbers). A Mesh neither copies nor moves (its Comms
// are referred to by the blocks built on them).
// Cost: one split (an all-gather of two ints) per axis at construction; a lookup is a scan of the
// few axis names.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu {

struct MeshAxis {
  std::string name;
  int size = 1;
};

class Mesh {
 public:
  Mesh(Comm& parent, std::vector<MeshAxis> axes);
  Mesh(Rank& rank, std::vector<MeshAxis> axes) : Mesh(rank.comm(), std::move(axes)) {}
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const std::vector<MeshAxis>& axes() const { return axes_; }
  // std::invalid_argument naming the unknown axis and the mesh's axes.
  Comm& axis(std::string_view name);
  int coord(std::string_view name) const;  // this rank's coordinate on the axis
  int size(std::string_view name) const;
  std::string describe() const;  // "dp=2 × sp=2 × tp=2"

 private:
  std::size_t index(std::string_view name) const;
  std::vector<MeshAxis> axes_;
  std::vector<int> coords_;
  std::vector<Comm> comms_;
};

}  // namespace tspemu
