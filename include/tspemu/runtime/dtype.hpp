// Element types the collectives carry. Reductions (sum) are defined for the arithmetic types;
// Dtype::byte is a raw view for data movement only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tspemu {

enum class Dtype : std::uint8_t { byte, i32, i64, f32, f64 };

constexpr std::size_t dtype_size(Dtype t) {
  switch (t) {
    case Dtype::byte:
      return 1;
    case Dtype::i32:
      return 4;
    case Dtype::i64:
      return 8;
    case Dtype::f32:
      return 4;
    case Dtype::f64:
      return 8;
  }
  return 0;
}

constexpr const char* dtype_name(Dtype t) {
  switch (t) {
    case Dtype::byte:
      return "byte";
    case Dtype::i32:
      return "int32";
    case Dtype::i64:
      return "int64";
    case Dtype::f32:
      return "float";
    case Dtype::f64:
      return "double";
  }
  return "?";
}

template <class T>
constexpr Dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return Dtype::f32;
  else if constexpr (std::is_same_v<T, double>)
    return Dtype::f64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return Dtype::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return Dtype::i64;
  else if constexpr (std::is_same_v<T, std::byte> || std::is_same_v<T, unsigned char>)
    return Dtype::byte;
  else
    static_assert(sizeof(T) == 0, "tspemu collectives carry float, double, int32, int64 or bytes");
}

}  // namespace tspemu
