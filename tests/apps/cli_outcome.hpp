// The tspemu command run through its library entry point (tspemu_main.hpp) with an argv, for
// the app tests: exit code and both streams; and a per-test temporary file name.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tspemu_main.hpp"

namespace tspemu::app::testing {

struct Outcome {
  int code;
  std::string out, err;
};

inline Outcome tspemu(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int code = tspemu_main(args, out, err);
  return {code, out.str(), err.str()};
}

// A file name in the temporary directory, unique to the running test.
inline std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return (std::filesystem::temp_directory_path() /
          (std::string("tspemu_") + info->name() + "_" + name))
      .string();
}

}  // namespace tspemu::app::testing
