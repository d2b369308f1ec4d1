// PyTorch pipelining's schedule CSV (plan/pipeline_csv.hpp): both formats round-trip every
// generated schedule; a PyTorch-style table with idle cells and "\r\n" rows reads back as the
// schedule it spells; torch 2.5's "B"/"BW" names; an imported table with an unmatched send is
// refused by the checker naming the send; bad cells and files are named.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "plan_test_shapes.hpp"
#include "tspemu/core/regular_file.hpp"
#include "tspemu/plan/pipeline_check.hpp"
#include "tspemu/plan/pipeline_csv.hpp"
#include "tspemu/plan/pipeline_schedule.hpp"

namespace tspemu::pipeline {
namespace {

using plan_testing::kShape;

Schedule renamed(Schedule s, const std::string& name) {
  s.name = name;
  return s;
}

std::string error_of(std::string_view text, const CsvOptions& opt = {}) {
  try {
    from_csv(text, opt);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted:\n" << text;
  return "";
}

TEST(PipelineCsv, EveryGeneratedScheduleRoundTripsInBothFormats) {
  for (const int p : {1, 2, 3, 4})
    for (int m = 1; m <= 2 * p + 1; ++m)
      for (const Kind k : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved_1f1b, Kind::zb_h1})
        for (const int v : {1, 2, 3}) {
          const ScheduleSpec spec{k, p, m, v, kShape};
          if (refusal(spec)) continue;
          const Schedule s = make_schedule(spec);
          for (const CsvFormat f : {CsvFormat::compute_only, CsvFormat::compute_comms}) {
            const std::string text = to_csv(s, f);
            const Schedule back = from_csv(text, {kShape, 0, false});
            EXPECT_EQ(renamed(back, s.name), s)
                << kind_name(k) << " p=" << p << " m=" << m << " v=" << v << "\n"
                << text;
            EXPECT_EQ(to_csv(back, f), text);
          }
        }
}

TEST(PipelineCsv, WritesPyTorchSpellingOneRowPerRank) {
  const Schedule s = make_schedule({Kind::one_f_one_b, 2, 2, 1, kShape});
  EXPECT_EQ(to_csv(s, CsvFormat::compute_only), "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  EXPECT_EQ(to_csv(s),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
            "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n");
}

TEST(PipelineCsv, ReadsIdleCellsAndCrLfRowsAsPyTorchWritesThem) {
  // PyTorch's compute-only tables keep idle time steps as empty cells; csv.writer ends rows
  // with "\r\n".
  const Schedule s = from_csv(",0F0,0F1,,,0B0,0B1\r\n,,1F0,1F1,1B0,1B1\r\n", {kShape, 0, false});
  EXPECT_EQ(renamed(s, "gpipe"), make_schedule({Kind::gpipe, 2, 2, 1, kShape}));
  EXPECT_FALSE(check_schedule(s));
  // Interleaved stages, inferred from the rows: 0 and 2 on rank 0, 1 and 3 on rank 1.
  const Schedule t = from_csv(to_csv(make_schedule({Kind::interleaved_1f1b, 2, 2, 2, {}})));
  EXPECT_EQ(t.stages, 4);
  EXPECT_EQ(t.microbatches, 2);
  EXPECT_EQ(t.stage_rank, (std::vector<int>{0, 1, 0, 1}));
}

TEST(PipelineCsv, ImportedUnmatchedSendIsRefusedByTheChecker) {
  // Rank 1 never posts the receive of microbatch 1's activation.
  const Schedule s = from_csv(
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n",
      {kShape, 0, false});
  const auto e = check_schedule(s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rank, 0);
  EXPECT_EQ(e->index, 3);
  EXPECT_EQ(e->stage, 0);
  EXPECT_EQ(e->microbatch, 1);
  EXPECT_EQ(e->message,
            "rank 0 action 3 (0SEND_F1: stage 0, microbatch 1): unmatched send: rank 1 has no "
            "1RECV_F1 to receive it");
}

TEST(PipelineCsv, LegacyNamesReadTorch25Tables) {
  // torch 2.5: "B" the input-gradient pass, "BW" the full backward.
  const Schedule s = from_csv("0F0,0B0,0W0,0F1,0BW1\n", {{}, 0, true});
  ASSERT_EQ(s.actions[0].size(), 5u);
  EXPECT_EQ(s.actions[0][1].op, Op::backward_input);
  EXPECT_EQ(s.actions[0][2].op, Op::backward_weight);
  EXPECT_EQ(s.actions[0][4].op, Op::backward);
  EXPECT_FALSE(check_schedule(s));
  // Read with today's names, "0B0" is a full backward, so its W has no I.
  const auto e = check_schedule(from_csv("0F0,0B0,0W0\n"));
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("both a full backward B"), std::string::npos) << e->message;
  EXPECT_NE(error_of("0F0,0BW0\n").find("cell 2: pipeline action '0BW0'"), std::string::npos);
}

TEST(PipelineCsv, BadCellsAndTablesAreNamed) {
  EXPECT_EQ(error_of("0F0\n1F0,1X1\n"),
            "schedule CSV line 2 (rank 1), cell 2: pipeline action '1X1': unknown op (expected F, "
            "B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD or REDUCE_GRAD)");
  EXPECT_EQ(error_of("0F0,1F0\n1B0\n"),
            "schedule CSV line 2 (rank 1), cell 1: stage 1 is already on rank 0 (schedule CSV "
            "line 1 (rank 0), cell 2)");
  EXPECT_EQ(error_of(""), "schedule CSV: no actions");
  EXPECT_NE(error_of("0F0,0B0\n2F0,2B0\n").find("stage 1 has no action on any rank"),
            std::string::npos);
}

TEST(PipelineCsv, WritingRefusesASendThePyTorchFormatCannotName) {
  Schedule s = make_schedule({Kind::gpipe, 3, 1, 1, kShape});
  s.actions[0][1].peer_stage = 2;
  try {
    to_csv(s);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 0SEND_F0 talks to stage 2"), std::string::npos)
        << e.what();
  }
}

TEST(PipelineCsv, FilesRoundTripAndErrorsNameThePath) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tspemu_pipeline_csv_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "zb.csv").string();
  const Schedule s = make_schedule({Kind::zb_h1, 3, 5, 1, kShape});
  save_csv(path, s);
  EXPECT_EQ(renamed(load_csv(path, {kShape, 0, false}), s.name), s);
  const std::string bad = (dir / "bad.csv").string();
  save_csv(bad, from_csv("0F0,0B0\n"));
  {
    std::FILE* f = std::fopen(bad.c_str(), "a");
    ASSERT_NE(f, nullptr);
    std::fputs("1F0,1Q0\n", f);
    std::fclose(f);
  }
  try {
    load_csv(bad);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind(bad + ": schedule CSV line 2 (rank 1), cell 2", 0), 0u)
        << e.what();
  }
  EXPECT_THROW(load_csv((dir / "missing.csv").string()), FileReadError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tspemu::pipeline
