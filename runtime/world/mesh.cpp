#include "tspemu/runtime/mesh.hpp"

#include <stdexcept>
#include <utility>

namespace tspemu {

Mesh::Mesh(Comm& parent, std::vector<MeshAxis> axes) : axes_(std::move(axes)) {
  long long product = 1;
  for (std::size_t a = 0; a < axes_.size(); ++a) {
    const MeshAxis& ax = axes_[a];
    if (ax.name.empty() || ax.size < 1)
      throw std::invalid_argument("mesh " + describe() + ": axis " + std::to_string(a) +
                                  " needs a name and a size >= 1 (got '" + ax.name +
                                  "'=" + std::to_string(ax.size) + ")");
    for (std::size_t b = 0; b < a; ++b)
      if (axes_[b].name == ax.name)
        throw std::invalid_argument("mesh " + describe() + ": axis '" + ax.name + "' named twice");
    product *= ax.size;
  }
  if (axes_.empty() || product != parent.size())
    throw std::invalid_argument("mesh " + describe() + " has " + std::to_string(product) +
                                " ranks, but the group '" + parent.name() + "' has " +
                                std::to_string(parent.size()));
  // Row-major coordinates, the last axis fastest.
  coords_.resize(axes_.size());
  for (int rest = parent.rank(), a = static_cast<int>(axes_.size()) - 1; a >= 0; --a) {
    coords_[static_cast<std::size_t>(a)] = rest % axes_[static_cast<std::size_t>(a)].size;
    rest /= axes_[static_cast<std::size_t>(a)].size;
  }
  comms_.reserve(axes_.size());
  for (std::size_t a = 0; a < axes_.size(); ++a) {
    // The color numbers the other coordinates (row-major over the axes but this one).
    int color = 0;
    for (std::size_t b = 0; b < axes_.size(); ++b)
      if (b != a) color = color * axes_[b].size + coords_[b];
    comms_.push_back(parent.split(color, coords_[a], axes_[a].name));
  }
}

std::size_t Mesh::index(std::string_view name) const {
  for (std::size_t a = 0; a < axes_.size(); ++a)
    if (axes_[a].name == name) return a;
  throw std::invalid_argument("mesh " + describe() + " has no axis '" + std::string(name) + "'");
}

Comm& Mesh::axis(std::string_view name) {
  return comms_[index(name)];
}

int Mesh::coord(std::string_view name) const {
  return coords_[index(name)];
}

int Mesh::size(std::string_view name) const {
  return axes_[index(name)].size;
}

std::string Mesh::describe() const {
  std::string s;
  for (const MeshAxis& a : axes_)
    s += (s.empty() ? "" : " × ") + a.name + "=" + std::to_string(a.size);
  return s.empty() ? "(no axes)" : s;
}

}  // namespace tspemu
