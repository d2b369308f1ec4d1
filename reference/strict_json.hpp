// Strict JSON for the files a checkpoint holds (config.json, the shard index, a safetensors
// header), internal to tspemu::reference.
//
// What: read_bounded_file reads a regular file of at most max_bytes (core/regular_file.hpp: a
//   FIFO or device is refused without blocking); StrictJsonCheck is a SAX handler that refuses
//   nesting deeper than max_depth and a key twice in one object (nlohmann's std::map would keep
//   only the last, silently); parse_strict_json runs it over the text, then parses the text.
// Guarantees: every refusal calls fail(reason), which must throw; reasons quote keys sanitized.
//   The check runs first and builds nothing, so a hostile text costs neither stack nor memory
//   before it is refused. Both passes are linear in the text (nlohmann's parser callback is not:
//   its end of each object scans the enclosing object for discarded values, quadratic in a
//   header of many tensor entries).
// Cost: two linear passes over the text; one set of keys per open object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tspemu/core/regular_file.hpp"
#include "tspemu/core/sanitized.hpp"

namespace tspemu::ref::detail {

using Fail = std::function<void(const std::string& reason)>;

inline std::string read_bounded_file(const std::string& path, std::size_t max_bytes,
                                     const Fail& fail) {
  try {
    return read_regular_file(path, max_bytes, "the bound of such a file");
  } catch (const FileReadError& e) {
    fail(e.reason());
  }
  return {};  // unreachable: fail throws
}

// The checking pass: nlohmann's SAX interface, building nothing. depth() is the number of
// containers open around the current event; entry() the key at depth 1 whose value is being
// parsed (a tensor's name in a safetensors header), for the caller's messages.
class StrictJsonCheck {
 public:
  using Json = nlohmann::json;
  StrictJsonCheck(int max_depth, Fail fail) : max_depth_(max_depth), fail_(std::move(fail)) {}

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(Json::number_integer_t) { return true; }
  bool number_unsigned(Json::number_unsigned_t) { return true; }
  bool number_float(Json::number_float_t, const Json::string_t&) { return true; }
  bool string(Json::string_t&) { return true; }
  bool binary(Json::binary_t&) { return true; }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(Json::string_t& k) {
    if (keys_.size() == 1) entry_ = k;
    if (!keys_.back().insert(k).second) fail_("duplicate key '" + sanitized(k) + "'");
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }

  int depth() const { return static_cast<int>(keys_.size()); }
  bool root_is_object() const { return root_is_object_; }
  const std::string& entry() const { return entry_; }

 private:
  bool open(bool object) {
    if (depth() >= max_depth_) fail_("nests deeper than " + std::to_string(max_depth_) + " levels");
    if (keys_.empty()) root_is_object_ = object;
    keys_.emplace_back();  // an array's set stays empty
    return true;
  }
  bool close() {
    keys_.pop_back();
    return true;
  }

  int max_depth_;
  Fail fail_;
  std::vector<std::set<std::string>> keys_;  // the keys seen so far in each open container
  bool root_is_object_ = false;
  std::string entry_;
};

// Checks text with `check` (fail() on its refusals), then parses it; fail("not valid JSON")
// when either pass finds a syntax error.
inline nlohmann::json parse_checked_json(std::string_view text, StrictJsonCheck& check,
                                         const Fail& fail) {
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &check)) fail("not valid JSON");
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) fail("not valid JSON");
  return j;
}

inline nlohmann::json parse_strict_json(std::string_view text, int max_depth, const Fail& fail) {
  StrictJsonCheck check(max_depth, fail);
  return parse_checked_json(text, check, fail);
}

}  // namespace tspemu::ref::detail
