// What the command tests (tests/apps/*_command_test.cpp, cli_test.cpp ...) check on every output:
// a tiny model for fast runs, the JSON documents' common keys, the BLAS line of a text report,
// and SVG that is well-formed XML with one <svg> root.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/blas_kernel.hpp"

namespace tspemu::app::testing {

// A tiny model every strategy accepts on up to 4 ranks.
inline std::vector<std::string> tiny(std::vector<std::string> args) {
  for (const char* a : {"--layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "4",
                        "--ffn", "48", "--vocab", "64", "--seq", "32", "-q"})
    args.emplace_back(a);
  return args;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return nlohmann::json::parse(f);
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Minimal XML well-formedness: every tag closed in order, one root element named `root`,
// attribute quotes balanced; the prolog and comments are skipped.
inline bool well_formed(const std::string& xml, const std::string& root, std::string* why) {
  std::vector<std::string> open;
  int roots = 0;
  std::size_t i = 0;
  while ((i = xml.find('<', i)) != std::string::npos) {
    const std::size_t end = xml.find('>', i);
    if (end == std::string::npos) return *why = "unterminated tag", false;
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return *why = "empty tag", false;
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) return *why = "quotes in <" + tag, false;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return *why = "unbalanced </" + name + ">", false;
      open.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (open.empty()) {
      ++roots;
      if (name != root) return *why = "root is <" + name + ">", false;
    }
    if (tag.back() != '/') open.push_back(name);
  }
  if (!open.empty()) return *why = "<" + open.back() + "> not closed", false;
  if (roots != 1) return *why = std::to_string(roots) + " root elements", false;
  return true;
}

// Every document names the BLAS and bf16 GEMM kernels its timings ran on, as the text report does.
inline void expect_document(const nlohmann::json& j, const char* command) {
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("command"), command);
  EXPECT_EQ(j.at("schema_version"), 1);
  EXPECT_EQ(j.at("blas"), ref::describe_blas());
  EXPECT_EQ(j.at("bf16_gemm"), ref::describe_bf16_gemm());
  EXPECT_TRUE(j.at("config").is_object());
}

inline void expect_blas_line(const std::string& report) {
  for (const std::string& line : {"\nblas: " + ref::describe_blas() + "\n",
                                  "\nbf16 gemm: " + ref::describe_bf16_gemm() + "\n"})
    EXPECT_NE(report.find(line), std::string::npos) << "no line <" << line << "> in\n" << report;
}

}  // namespace tspemu::app::testing
