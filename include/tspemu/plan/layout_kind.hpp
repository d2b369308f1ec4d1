// LayoutKind: the names of the sequence layouts (which tokens a rank holds: tsp/sequence_layout.hpp
// defines them). The planner's rules need only the name: the zigzag layout cuts a sequence into
// 2·D chunks, so it asks 2·D | S where the others ask D | S.
#pragma once

#include <string>

namespace tspemu::tsp {

enum class LayoutKind { contiguous, zigzag, striped };
const char* layout_name(LayoutKind k);             // "contiguous", "zigzag", "striped"
LayoutKind parse_layout(const std::string& name);  // throws std::invalid_argument

}  // namespace tspemu::tsp
