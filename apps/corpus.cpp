#include "corpus.hpp"

#include <array>
#include <cctype>
#include <sstream>
#include <stdexcept>

#include "tspemu/core/regular_file.hpp"
#include "tspemu/reference/init.hpp"

namespace tspemu::app {

std::vector<std::int32_t> builtin_corpus(std::size_t bytes) {
  static constexpr std::array subjects{"the rank", "every shard", "the ring",   "a token",
                                       "the head", "the arena",   "each layer", "the oracle"};
  static constexpr std::array verbs{"sends", "gathers", "reduces", "keeps", "checks", "folds"};
  static constexpr std::array objects{"its weights",    "the keys and values", "one gradient",
                                      "the next block", "every sequence",      "the loss"};
  static constexpr std::array ends{".", ".", ",", " and", "."};
  ref::SplitMix64 gen(16);
  std::string text;
  bool capital = true;
  while (text.size() < bytes) {
    std::string s = subjects[gen.next() % subjects.size()];
    if (capital) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    const char* end = ends[gen.next() % ends.size()];
    text += s + " " + verbs[gen.next() % verbs.size()] + " " +
            objects[gen.next() % objects.size()] + end + (std::string(end) == "." ? "\n" : " ");
    capital = std::string(end) == ".";
  }
  text.resize(bytes);
  return byte_tokens(text, "the built-in corpus");
}

std::vector<std::int32_t> byte_tokens(const std::string& text, const std::string& what) {
  std::vector<std::int32_t> out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    // Sequence length from the lead byte (RFC 3629: no overlong 0xC0/0xC1, nothing past 0xF4).
    const std::size_t len = c < 0x80                  ? 1
                            : (c >= 0xC2 && c < 0xE0) ? 2
                            : (c >= 0xE0 && c < 0xF0) ? 3
                            : (c >= 0xF0 && c < 0xF5) ? 4
                                                      : 0;
    bool ok = len > 0 && i + len <= text.size();
    for (std::size_t k = 1; ok && k < len; ++k)
      ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (!ok)
      throw std::invalid_argument(what + ": not UTF-8 at byte " + std::to_string(i) + " (0x" + [c] {
        char b[3];
        std::snprintf(b, sizeof b, "%02X", c);
        return std::string(b);
      }() + "); give token ids in a .tokens file instead");
    for (std::size_t k = 0; k < len; ++k) out.push_back(static_cast<unsigned char>(text[i + k]));
    i += len;
  }
  return out;
}

std::vector<std::int32_t> read_corpus(const std::string& path) {
  std::string text;
  try {  // a regular file (a FIFO would block, /dev/zero never end), its size bounded first
    text = read_regular_file(path, kMaxCorpusBytes, "the corpus bound");
  } catch (const FileReadError& e) {
    throw std::invalid_argument("--data " + path + ": cannot open the file: " + e.reason());
  }
  if (text.empty()) throw std::invalid_argument("--data " + path + ": the file is empty");
  if (!path.ends_with(".tokens")) return byte_tokens(text, "--data " + path);
  std::vector<std::int32_t> out;
  std::istringstream is(text);
  std::string word;
  while (is >> word) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 0 || v > INT32_MAX)
      throw std::invalid_argument("--data " + path + ": token " + std::to_string(out.size()) +
                                  " is '" + word + "', not a token id in [0, 2^31)");
    out.push_back(static_cast<std::int32_t>(v));
  }
  if (out.empty()) throw std::invalid_argument("--data " + path + ": no tokens");
  return out;
}

}  // namespace tspemu::app
