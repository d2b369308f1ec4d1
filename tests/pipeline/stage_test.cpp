// How a pipeline cuts a model and a batch (stage.hpp): contiguous layer ranges, the first
// L mod S stages one layer longer; microbatches as consecutive sequence slices; and the cuts that
// cannot be made are refused naming the values.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/pipeline/stage.hpp"

namespace tspemu::pipeline {
namespace {

TEST(PipelineStageCut, LayersAreCutContiguouslyTheFirstStagesOneLonger) {
  std::vector<std::pair<int, int>> got;
  for (int k = 0; k < 3; ++k) {
    const StageSpan s = stage_span(8, 3, k);
    got.emplace_back(s.first_layer, s.end_layer);
    EXPECT_EQ(s.first(), k == 0);
    EXPECT_EQ(s.last(), k == 2);
  }
  EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{0, 3}, {3, 6}, {6, 8}}));
}

TEST(PipelineStageCut, MoreStagesThanLayersIsRefusedNamingTheValues) {
  try {
    stage_span(2, 4, 0);
    FAIL() << "4 stages of 2 layers accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot cut 2 layers into 4 stages"), std::string::npos)
        << e.what();
  }
}

TEST(PipelineStageCut, MicrobatchesAreConsecutiveSequencesAndMustDivideTheBatch) {
  std::vector<std::int32_t> tokens(12), targets(12);  // [B = 4, T = 3]
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::int32_t(i);
  const ref::Batch b{4, 3, tokens, targets, {}};
  const auto mbs = cut_microbatches(b, 2);
  ASSERT_EQ(mbs.size(), 2u);
  EXPECT_EQ(mbs[1].B, 2);
  EXPECT_EQ(mbs[1].tokens.front(), 6);
  EXPECT_EQ(mbs[1].tokens.size(), 6u);
  try {
    cut_microbatches(b, 3);
    FAIL() << "3 microbatches of 4 sequences accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3 microbatches do not divide the batch of B=4"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tspemu::pipeline
