// `tspemu paper` (paper_command.hpp): six figures, the page and a row for every published
// number; the page rendered by a headless browser.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli_outcome.hpp"
#include "cli_test_support.hpp"

namespace tspemu::app {
namespace {

using namespace testing;  // cli_outcome.hpp, cli_test_support.hpp

// tspemu paper writes the six figures (well-formed SVG with drawn marks), the page and a table row
// for every published number; the memory rows under both assumption sets, the crossing exactly 8h.
TEST(Cli, PaperWritesSixFiguresThePageAndARowForEveryPublishedNumber) {
  const std::string dir = temp_path("paper");
  std::filesystem::remove_all(dir);
  const Outcome o = tspemu({"paper", "--out", dir});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  for (const char* f : {"figure1", "figure5", "figure6", "figure7", "figure9", "figure10"}) {
    const std::string doc = read_file(dir + "/" + f + ".svg");
    std::string why;
    EXPECT_TRUE(well_formed(doc, "svg", &why)) << f << ": " << why;
    EXPECT_TRUE(doc.find("<polyline") != std::string::npos ||
                doc.find("<path") != std::string::npos || doc.find("<rect x") != std::string::npos)
        << f;
  }
  const nlohmann::json j = read_json(dir + "/paper.json");
  expect_document(j, "paper");
  const auto& rows = j.at("rows");
  ASSERT_EQ(rows.size(), 11u);  // 6 memory points, crossing, 128K ratio, 2 throughputs, ratio
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(rows[i].at("unit"), "GB");
    EXPECT_GT(rows[i].at("tspemu").get<double>(), 0);
    EXPECT_GT(rows[i].at("tspemu_megatron").get<double>(), rows[i].at("tspemu").get<double>())
        << "18 B/param holds more than 16";
  }
  EXPECT_EQ(rows[6].at("published"), 32768.0);
  EXPECT_EQ(rows[6].at("tspemu"), 32768.0);
  EXPECT_DOUBLE_EQ(rows[7].at("tspemu").get<double>(), 0.625);
  EXPECT_GT(rows[8].at("tspemu").get<double>(), 0);  // tokens/s from the time model
  const std::string page = read_file(dir + "/index.html");
  EXPECT_GT(std::count(page.begin(), page.end(), '\n'), 10);
  EXPECT_NE(page.find("megatron-mi300x"), std::string::npos);
  EXPECT_NE(page.find("18 B/param"), std::string::npos);  // the assumptions are on the page
  std::filesystem::remove_all(dir);
}

// The page opened by a real browser (Debian's Chromium, headless): its script finds every figure
// laid out with drawn marks (SVG bounding boxes, so layout ran) and says so in the DOM.
TEST(Cli, PaperPageRendersEveryFigureInHeadlessChromium) {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it)";
  const std::string dir = temp_path("paper_browser");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(tspemu({"paper", "--out", dir}).code, 0);
  const std::string dom = dir + "/dom.html";
  const std::string cmd =
      "timeout 120 chromium --headless --no-sandbox --disable-gpu "
      "--disable-dev-shm-usage --dump-dom file://" +
      dir + "/index.html > " + dom + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string got = read_file(dom);
  EXPECT_NE(got.find("figures rendered: 6 of 6"), std::string::npos) << got.substr(0, 2000);
  std::size_t rendered = 0;
  for (auto at = got.find("data-rendered=\"yes\""); at != std::string::npos;
       at = got.find("data-rendered=\"yes\"", at + 1))
    ++rendered;
  EXPECT_EQ(rendered, 6u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tspemu::app
