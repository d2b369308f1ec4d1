// `tspemu train --pp P --microbatches M --schedule NAME` (train_pipeline.hpp): the whole model
// trains pipelined within the rule at every step, for every schedule; bad pipeline flags are
// refused with exit 2 naming the flag and the values before any rank starts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_outcome.hpp"

namespace tspemu::app {
namespace {

// A tiny model of 4 layers, a batch of 4 sequences, 2 steps.
std::vector<std::string> tiny_pipeline(std::vector<std::string> args) {
  args.insert(args.begin(), "train");
  for (const char* a :
       {"--layers", "4", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--ffn", "64",
        "--vocab", "256", "--seq", "16", "--batch", "4", "--steps", "2", "-q"})
    args.emplace_back(a);
  return args;
}

TEST(TrainPipeline, EveryScheduleTrainsWithinTheRuleAtEveryStep) {
  const std::vector<std::vector<std::string>> cases = {
      {"--pp", "2", "--microbatches", "4", "--schedule", "1f1b"},
      {"--pp", "4", "--microbatches", "2", "--schedule", "gpipe", "--tied"},
      {"--pp", "2", "--microbatches", "2", "--schedule", "interleaved-1f1b"},
      {"--pp", "2", "--microbatches", "4", "--schedule", "zb-h1", "--optimizer", "sgd"}};
  for (const auto& c : cases) {
    const testing::Outcome o = testing::tspemu(tiny_pipeline(c));
    EXPECT_EQ(o.code, 0) << c[5] << "\n" << o.out << o.err;
    EXPECT_NE(o.out.find("verdict: PASS"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find("pipeline " + c[5]), std::string::npos) << o.out;
  }
}

TEST(TrainPipeline, RefusesBadPipelineFlagsWithExitTwoNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--pp", "8"}, "--pp 8 x 1 virtual stages = 8 stages > --layers 4"},
      {{"--pp", "2", "--schedule", "interleaved-1f1b", "--virtual-stages", "4"},
       "= 8 stages > --layers 4"},
      {{"--pp", "2", "--microbatches", "3"}, "--microbatches 3 does not divide --batch 4"},
      {{"--pp", "2", "--microbatches", "0"}, "--microbatches"},
      {{"--pp", "2", "--schedule", "dualpipe"}, "--schedule dualpipe"},
      {{"--pp", "2", "--layers-only"}, "drop --layers-only"}};
  for (const auto& [flags, message] : cases) {
    const testing::Outcome o = testing::tspemu(tiny_pipeline(flags));
    EXPECT_EQ(o.code, 2) << message << "\n" << o.out << o.err;
    EXPECT_NE(o.err.find(message), std::string::npos) << o.err;
    EXPECT_EQ(o.out.find("step"), std::string::npos) << "nothing ran: " << o.out;
  }
}

}  // namespace
}  // namespace tspemu::app
