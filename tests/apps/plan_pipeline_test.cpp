// `tspemu plan --pp` (plan_pipeline.hpp) through the command's entry point: the bubble is the
// simulated clock's, beside its closed form; the activations each rank keeps are its peak
// (stage, microbatch) count × a stage's layers × one layer's kept bytes; bad options are refused
// naming the flags, exit 2, nothing written.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_outcome.hpp"

namespace tspemu::app {
namespace {

using testing::Outcome;
using testing::tspemu;

// The report's line for `rank` in the activation table (a failure when absent).
std::string rank_line(const std::string& out, int rank) {
  const std::string head = "\n  " + std::to_string(rank) + " ";
  const std::size_t at = out.find(head);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no line for rank " << rank << " in\n" << out;
    return "";
  }
  return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
}

TEST(PlanPipeline, OneFOneBBubbleAndActivationsAtThePaperModel) {
  // paper-7b: 32 layers, h = 4096; --seq 128K, 8 sequences in 8 microbatches over 4 ranks.
  const Outcome o = tspemu({"plan", "paper-7b", "--pp", "4", "--batch", "8"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("pipeline 1f1b: p = 4 ranks, 4 stages (v = 1), m = 8 microbatches of 1 "
                       "sequence × 131072 tokens, 32 layers: 8 per stage"),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("every rank idles 3/11 = 27.27%; closed form (p-1)/(m+p-1) = 3/11"),
            std::string::npos)
      << o.out;
  // Full recompute keeps each layer's input: 131072 · 4096 · 2 B = 1.074 GB per layer per
  // microbatch; rank s holds min(p − s, m) microbatches of its 8 layers.
  EXPECT_NE(o.out.find("recompute full: 1.074 GB per layer per microbatch"), std::string::npos);
  const std::vector<std::string> gb = {"34.360", "25.770", "17.180", "8.590"};
  for (int r = 0; r < 4; ++r) {
    const std::string line = rank_line(o.out, r);
    EXPECT_NE(line.find(" " + std::to_string(4 - r) + " "), std::string::npos) << line;
    EXPECT_EQ(line.substr(line.size() - gb[r].size()), gb[r]) << line;
  }
}

TEST(PlanPipeline, InterleavedAndZeroBubbleClosedForms) {
  const Outcome il =
      tspemu({"plan", "paper-7b", "--pp", "4", "--batch", "16", "--schedule", "interleaved-1f1b"});
  ASSERT_EQ(il.code, 0) << il.err;
  EXPECT_NE(il.out.find("8 stages (v = 2)"), std::string::npos) << il.out;
  EXPECT_NE(il.out.find("every rank idles 3/35 = 8.57%; closed form (p-1)/(v·m+p-1) = 3/35"),
            std::string::npos)
      << il.out;
  const Outcome zb =
      tspemu({"plan", "paper-7b", "--pp", "4", "--batch", "8", "--schedule", "zb-h1"});
  ASSERT_EQ(zb.code, 0) << zb.err;
  EXPECT_NE(zb.out.find("F = I = W = 1"), std::string::npos) << zb.out;
  EXPECT_NE(zb.out.find("every rank idles 1/9 = 11.11%; closed form (p-1)/(3m+p-1) = 1/9"),
            std::string::npos)
      << zb.out;
  // Fewer microbatches than ranks: measured, no closed form claimed.
  const Outcome few =
      tspemu({"plan", "paper-7b", "--pp", "4", "--batch", "2", "--schedule", "zb-h1"});
  ASSERT_EQ(few.code, 0) << few.err;
  EXPECT_NE(few.out.find("no closed form below m = p"), std::string::npos) << few.out;
}

TEST(PlanPipeline, BadOptionsAreRefusedNamingTheFlags) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"plan", "--pp", "64"},
       "--pp 64 × --virtual-stages 1 = 64 stages: more than --layers 32 (each stage needs at "
       "least one layer)"},
      {{"plan", "--pp", "3"}, "--pp 3 × --virtual-stages 1 = 3 stages: must divide --layers 32"},
      {{"plan", "--pp", "4", "--layers", "2"}, "4 stages: more than --layers 2"},
      {{"plan", "--pp", "4", "--batch", "8", "--microbatches", "3"},
       "--microbatches 3: must divide --batch 8"},
      {{"plan", "--pp", "2", "--batch", "6", "--microbatches", "4"},
       "--microbatches 4: must divide --batch 6"},
      {{"plan", "--pp", "4", "--batch", "9", "--schedule", "interleaved-1f1b"},
       "--schedule interleaved-1f1b --pp 4 --microbatches 9: interleaved-1f1b: microbatches m=9 "
       "is not a multiple of the 2 rounds"},
      {{"plan", "--pp", "2", "--virtual-stages", "2"}, "1f1b: virtual stages v=2 must be 1"},
      {{"plan", "--pp", "2", "--schedule", "dualpipe"},
       "--schedule dualpipe: unknown pipeline schedule 'dualpipe'"},
      {{"plan", "--pp", "2", "--inference"}, "--inference: not with --pp 2"},
      {{"plan", "--pp", "2", "--dry-run"}, "--dry-run: not with --pp 2"},
      {{"plan", "--pp", "2", "--batch", "2000000"},
       "--microbatches (--batch 2000000) × --pp 2 × --virtual-stages 1: at most 1048576"},
      {{"plan", "--pp", "0"}, "--pp 0: must be >= 1"},
      {{"plan", "--pp", "2", "--microbatches", "0"}, "--microbatches 0: must be >= 1"},
  };
  // The whole error stream is the one message, each flag named with its value.
  for (const Case& c : cases) {
    const Outcome o = tspemu(c.args);
    EXPECT_EQ(o.code, 2) << o.err;
    EXPECT_EQ(o.err.rfind("tspemu: invalid configuration: ", 0), 0u) << o.err;
    EXPECT_NE(o.err.find(c.message), std::string::npos) << o.err;
    EXPECT_EQ(o.err.find('\n'), o.err.size() - 1) << o.err;
    EXPECT_EQ(o.out, "") << c.message;
  }
}

}  // namespace
}  // namespace tspemu::app
