// The CLI11 types the command headers name, declared without CLI11 itself.
// Why: <CLI/CLI.hpp> is header-only, and compiling it dominates any translation unit that
// includes it; the headers pass CLI::App and CLI::Option only by reference or pointer, so only the
// .cpp files that call CLI11 include it.
#pragma once

namespace CLI {
class App;
class Option;
}  // namespace CLI
