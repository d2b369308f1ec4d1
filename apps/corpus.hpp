// The token corpus `tspemu train` reads: a built-in deterministic text, or a file.
//
// Byte-level tokenizer: a UTF-8 text is its bytes, each a token id in [0, 256) (so the model's
//   vocabulary must be at least 256). The built-in corpus is English-like text generated from a
//   small grammar by a fixed SplitMix64 stream: the same bytes on every machine, repetitive
//   enough that a small model's loss falls within a few dozen steps.
// Files: a name ending in ".tokens" holds token ids as decimal integers separated by whitespace;
//   anything else is UTF-8 text. Errors (std::invalid_argument) name the file and the byte
//   offset or token index at fault: an unreadable or empty file, malformed UTF-8, a token that is
//   not a non-negative integer; a file that is not regular (a FIFO, /dev/zero) or larger than
//   kMaxCorpusBytes is refused before it is read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tspemu::app {

// 1 GiB of text is 4 GiB of token ids: far past what a training on this emulator consumes.
inline constexpr std::uint64_t kMaxCorpusBytes = std::uint64_t{1} << 30;

std::vector<std::int32_t> builtin_corpus(std::size_t bytes = 1 << 16);
std::vector<std::int32_t> read_corpus(const std::string& path);
// The bytes of a UTF-8 text as token ids; `what` names the source in errors.
std::vector<std::int32_t> byte_tokens(const std::string& text, const std::string& what);

}  // namespace tspemu::app
