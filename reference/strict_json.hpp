// Strict JSON for the small files a checkpoint directory holds (config.json, the shard index),
// internal to tspemu::reference.
//
// What: read_bounded_file reads a regular file of at most max_bytes; parse_strict_json parses
//   text as JSON, refusing nesting deeper than max_depth while parsing (so a hostile file costs
//   neither stack nor time) and a key twice in one object (nlohmann's std::map would keep only
//   the last, silently).
// Guarantees: every refusal calls fail(reason), which must throw; reasons quote keys sanitized.
#pragma once

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "tspemu/core/sanitized.hpp"

namespace tspemu::ref::detail {

using Fail = std::function<void(const std::string& reason)>;

inline std::string read_bounded_file(const std::string& path, std::size_t max_bytes,
                                     const Fail& fail) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    fail(std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open it");
  std::string text;
  try {  // one byte past the limit at most: a huge file is refused without reading it all
    std::vector<char> buf(max_bytes + 1);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    text.assign(buf.data(), static_cast<std::size_t>(in.gcount()));
  } catch (const std::ios_base::failure& e) {
    fail(std::string("cannot read it: ") + e.what());
  }
  if (in.bad()) fail("cannot read it");
  if (text.size() > max_bytes) {
    fail("more than " + std::to_string(max_bytes) + " bytes, more than such a file can need");
  }
  return text;
}

inline nlohmann::json parse_strict_json(std::string_view text, int max_depth, const Fail& fail) {
  using Json = nlohmann::json;
  std::vector<std::set<std::string>> keys;  // the keys seen so far in each open object
  const auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    using Event = Json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      if (depth >= max_depth) fail("nests deeper than " + std::to_string(max_depth) + " levels");
      if (event == Event::object_start) keys.emplace_back();
    } else if (event == Event::object_end) {
      keys.pop_back();
    } else if (event == Event::key) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(key).second) fail("duplicate key '" + sanitized(key) + "'");
    }
    return true;
  };
  Json j = Json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("not valid JSON");
  return j;
}

}  // namespace tspemu::ref::detail
