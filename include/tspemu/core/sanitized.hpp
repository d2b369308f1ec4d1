// Sanitized text: how any text that came from outside (a file name, a JSON key or value, a parser's
// message) is quoted in an error message.
//
// What: at most `limit` bytes of s, printable ASCII kept and anything else — control characters,
// the bytes of multi-byte UTF-8, the single quote and the backslash — as \xNN, followed by the full
// length when cut short.
// Guarantees: the result is printable ASCII of at most 4·limit + 32 bytes, whatever s holds, so a
// hostile input can put neither megabytes nor terminal escapes into a message.
// Cost: O(min(|s|, limit)).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tspemu {

inline std::string sanitized(std::string_view s, std::size_t limit = 64) {
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > limit) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace tspemu
