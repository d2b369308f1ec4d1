// `tspemu scale` (scale_command.hpp): strong and weak rows in JSON and a well-formed SVG.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

#include "cli_outcome.hpp"
#include "cli_test_support.hpp"

namespace tspemu::app {
namespace {

using namespace testing;  // cli_outcome.hpp, cli_test_support.hpp

TEST(Cli, ScaleWritesJsonAndAWellFormedSvg) {
  const std::string json = temp_path("scale.json"), svg = temp_path("scale.svg");
  const Outcome o = tspemu(tiny({"scale", "--max-ranks", "2", "--repeat", "1", "--mode", "both",
                                 "--json", json, "--svg", svg}));
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("efficiency = "), std::string::npos);
  expect_blas_line(o.out);
  const nlohmann::json j = read_json(json);
  expect_document(j, "scale");
  EXPECT_TRUE(j.at("cores").is_number_integer());
  ASSERT_EQ(j.at("rows").size(), 4u);  // strong and weak at D = 1, 2
  for (const auto& r : j.at("rows")) {
    EXPECT_TRUE(r.at("mode") == "strong" || r.at("mode") == "weak");
    EXPECT_TRUE(r.at("tokens_per_s").is_number());
    EXPECT_TRUE(r.at("efficiency").is_number());
    EXPECT_EQ(r.at("model_match"), true);
  }
  EXPECT_DOUBLE_EQ(j.at("rows")[0].at("efficiency").get<double>(), 1.0);
  std::string why;
  EXPECT_TRUE(well_formed(read_file(svg), "svg", &why)) << why;
  std::remove(json.c_str());
  std::remove(svg.c_str());
}

}  // namespace
}  // namespace tspemu::app
