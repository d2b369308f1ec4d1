#include "tspemu/plan/layout_kind.hpp"

#include <stdexcept>

namespace tspemu::tsp {

const char* layout_name(LayoutKind k) {
  switch (k) {
    case LayoutKind::contiguous:
      return "contiguous";
    case LayoutKind::zigzag:
      return "zigzag";
    case LayoutKind::striped:
      return "striped";
  }
  return "?";
}

LayoutKind parse_layout(const std::string& name) {
  if (name == "contiguous") return LayoutKind::contiguous;
  if (name == "zigzag") return LayoutKind::zigzag;
  if (name == "striped") return LayoutKind::striped;
  throw std::invalid_argument("unknown sequence layout '" + name +
                              "' (expected contiguous, zigzag or striped)");
}

}  // namespace tspemu::tsp
