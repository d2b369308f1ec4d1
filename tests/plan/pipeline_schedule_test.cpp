// Pipeline schedules as data (plan/pipeline_schedule.hpp): the refusals with their reasons, the
// PyTorch action spelling both ways, the compute order of each schedule on small cases written
// out by hand, and every generated schedule over a grid of p × m (m < p included) accepted by the
// static checker under every blocking model.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/plan/pipeline_check.hpp"
#include "tspemu/plan/pipeline_schedule.hpp"

namespace tspemu::pipeline {
namespace {

std::vector<std::string> row(const Schedule& s, int rank) {
  std::vector<std::string> out;
  for (const Action& a : s.actions.at(rank)) out.push_back(to_string(a));
  return out;
}

using Row = std::vector<std::string>;

TEST(PipelineSchedule, ActionSpellingRoundTrips) {
  for (const char* text : {"1F0", "2B0", "0I3", "0W3", "0SEND_F1", "1RECV_F1", "2SEND_B0",
                           "1RECV_B0", "0UNSHARD", "3RESHARD", "12REDUCE_GRAD", "10F11"})
    EXPECT_EQ(to_string(parse_action(text)), text);
  const Action send = parse_action(" 0SEND_F1 ", {2, 8, 16});
  EXPECT_EQ(send.op, Op::send_f);
  EXPECT_EQ(send.stage, 0);
  EXPECT_EQ(send.microbatch, 1);
  EXPECT_EQ(send.peer_stage, 1);
  EXPECT_EQ(send.shape, (ActivationShape{2, 8, 16}));
  EXPECT_EQ(parse_action("2SEND_B0").peer_stage, 1);
  EXPECT_EQ(parse_action("1RECV_B0").peer_stage, 2);
  EXPECT_EQ(parse_action("0REDUCE_GRAD").microbatch, -1);
}

TEST(PipelineSchedule, BadActionTextIsRefusedWithTheText) {
  for (const char* text :
       {"", "F0", "1X0", "1F", "1F0x", "0REDUCE_GRAD1", "(0F0;1B0)OVERLAP_F_B", "1F99999999999"}) {
    try {
      parse_action(text);
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + text + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(PipelineSchedule, KindNamesRoundTripAndUnknownListsThem) {
  for (const Kind k : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved_1f1b, Kind::zb_h1})
    EXPECT_EQ(parse_kind(kind_name(k)), k);
  try {
    parse_kind("dualpipe");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'dualpipe'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("interleaved-1f1b"), std::string::npos);
  }
}

TEST(PipelineSchedule, RefusalsNameTheRuleAndValues) {
  EXPECT_FALSE(refusal({Kind::one_f_one_b, 4, 2, 1, {}}));        // m < p: warm-up capped at m
  EXPECT_FALSE(refusal({Kind::interleaved_1f1b, 4, 3, 2, {}}));   // one round of 3
  EXPECT_FALSE(refusal({Kind::interleaved_1f1b, 4, 10, 2, {}}));  // 2 rounds of 5
  const auto nine = refusal({Kind::interleaved_1f1b, 4, 9, 2, {}});
  ASSERT_TRUE(nine);
  EXPECT_NE(nine->find("m=9"), std::string::npos) << *nine;
  EXPECT_NE(nine->find("2 rounds"), std::string::npos) << *nine;
  EXPECT_NE(nine->find("p=4"), std::string::npos) << *nine;
  const auto v1 = refusal({Kind::interleaved_1f1b, 2, 4, 1, {}});
  ASSERT_TRUE(v1);
  EXPECT_NE(v1->find("v=1"), std::string::npos);
  const auto v2 = refusal({Kind::gpipe, 2, 4, 2, {}});
  ASSERT_TRUE(v2);
  EXPECT_NE(v2->find("v=2"), std::string::npos);
  EXPECT_NE(refusal({Kind::gpipe, 2, 0, 1, {}})->find("m=0"), std::string::npos);
  EXPECT_NE(refusal({Kind::zb_h1, 0, 2, 1, {}})->find("p=0"), std::string::npos);
  try {
    make_schedule({Kind::interleaved_1f1b, 4, 9, 2, {}});
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), *nine);
  }
}

TEST(PipelineSchedule, OneFOneBComputeOrderAtP3M4) {
  const Schedule s = make_compute_schedule({Kind::one_f_one_b, 3, 4, 1, {}});
  EXPECT_EQ(row(s, 0), (Row{"0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"}));
  EXPECT_EQ(row(s, 1), (Row{"1F0", "1F1", "1B0", "1F2", "1B1", "1F3", "1B2", "1B3"}));
  EXPECT_EQ(row(s, 2), (Row{"2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"}));
}

TEST(PipelineSchedule, OneFOneBWithFewerMicrobatchesThanStagesIsGpipeLike) {
  const Schedule s = make_compute_schedule({Kind::one_f_one_b, 4, 2, 1, {}});
  EXPECT_EQ(row(s, 0), (Row{"0F0", "0F1", "0B0", "0B1"}));
  EXPECT_EQ(row(s, 3), (Row{"3F0", "3B0", "3F1", "3B1"}));
}

TEST(PipelineSchedule, GpipeComputeOrder) {
  const Schedule s = make_compute_schedule({Kind::gpipe, 2, 3, 1, {}});
  EXPECT_EQ(row(s, 1), (Row{"1F0", "1F1", "1F2", "1B0", "1B1", "1B2"}));
}

TEST(PipelineSchedule, InterleavedComputeOrderAtP2M4V2) {
  // Stages 0, 2 on rank 0 and 1, 3 on rank 1; rounds of g = 2 microbatches; rank 0 warms up
  // (v−1)·g + 2(p−1) = 4 forwards, rank 1 two.
  const Schedule s = make_compute_schedule({Kind::interleaved_1f1b, 2, 4, 2, {}});
  EXPECT_EQ(s.stages, 4);
  EXPECT_EQ(s.stage_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(row(s, 0), (Row{"0F0", "0F1", "2F0", "2F1", "0F2", "2B0", "0F3", "2B1", "2F2", "0B0",
                            "2F3", "0B1", "2B2", "2B3", "0B2", "0B3"}));
  EXPECT_EQ(row(s, 1), (Row{"1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "1F2", "1B0", "1F3", "1B1",
                            "3F2", "3B2", "3F3", "3B3", "1B2", "1B3"}));
}

TEST(PipelineSchedule, ZbH1RankRDefersItsFirstRWeightPasses) {
  // Rank r runs its first r input-gradient passes without their W (PyTorch's
  // num_1f1b_microbatches = rank), so the gradient reaches the previous stage sooner; the
  // deferred W fill the drain.
  const Schedule s = make_compute_schedule({Kind::zb_h1, 2, 3, 1, {}});
  EXPECT_EQ(row(s, 0), (Row{"0F0", "0F1", "0I0", "0W0", "0F2", "0I1", "0W1", "0I2", "0W2"}));
  EXPECT_EQ(row(s, 1), (Row{"1F0", "1I0", "1F1", "1I1", "1W0", "1F2", "1I2", "1W1", "1W2"}));
}

TEST(PipelineSchedule, LoweringPlacesEachRecvWhereItsSendIsMade) {
  const Schedule s = make_schedule({Kind::one_f_one_b, 2, 2, 1, {1, 4, 8}});
  EXPECT_EQ(row(s, 0),
            (Row{"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"}));
  EXPECT_EQ(row(s, 1),
            (Row{"1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"}));
  for (const auto& list : s.actions)
    for (const Action& a : list)
      if (is_comm(a.op)) {
        EXPECT_EQ(a.shape, (ActivationShape{1, 4, 8}));
        EXPECT_EQ(a.peer_stage, default_peer_stage(a.op, a.stage));
      }
  EXPECT_EQ(compute_only(s), make_compute_schedule({Kind::one_f_one_b, 2, 2, 1, {}}));
}

TEST(PipelineSchedule, LoweringRefusesAComputeOrderThatCannotProceed) {
  // Rank 0 runs its backward of microbatch 0 before its forward of microbatch 1, but rank 1
  // needs microbatch 1 before its backward of 0 (it runs 1F0 1F1 1B0 1B1): a cycle.
  Schedule s = make_compute_schedule({Kind::gpipe, 2, 2, 1, {}});
  s.actions[0] = {parse_action("0F0"), parse_action("0B0"), parse_action("0F1"),
                  parse_action("0B1")};
  try {
    lower_send_recv(s, {});
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 0 action 1 (0B0, stage 0, microbatch 0) waits for stage 1's backward "
                     "of microbatch 0"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("rank 1 action 1 (1F1, stage 1, microbatch 1) waits for stage 0's forward"),
              std::string::npos)
        << m;
  }
}

// Every schedule over p × m (m < p and m mod p ≠ 0 included) passes every check, with sends
// never blocking and with tspemu's mailbox (4 messages in flight per ordered pair); GPipe, 1F1B
// and ZB-H1 with one.
TEST(PipelineSchedule, EveryGeneratedScheduleOverTheGridPassesTheChecker) {
  int checked = 0;
  for (const int p : {1, 2, 3, 4, 5, 8})
    for (int m = 1; m <= 4 * p; ++m)
      for (const Kind k : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved_1f1b, Kind::zb_h1})
        for (const int v : {1, 2, 3, 4}) {
          const ScheduleSpec spec{k, p, m, v, {2, 8, 16}};
          if (refusal(spec)) continue;
          const Schedule s = make_schedule(spec);
          std::vector<int> bounds{1 << 20, 4};
          if (k != Kind::interleaved_1f1b) bounds.push_back(1);
          for (const int in_flight : bounds) {
            const auto e = check_schedule(s, {in_flight});
            EXPECT_FALSE(e) << kind_name(k) << " p=" << p << " m=" << m << " v=" << v
                            << " sends_in_flight=" << in_flight << ": " << e->message;
          }
          ++checked;
        }
  EXPECT_GT(checked, 400);
}

// Interleaved at p = 2: each rank sends the other a forward (stage 0 -> 1, 1 -> 2) before it
// consumes the other's, so a mailbox of one message per pair deadlocks; two suffice here.
TEST(PipelineSchedule, InterleavedNeedsTwoMessagesInFlightPerPair) {
  const Schedule s = make_schedule({Kind::interleaved_1f1b, 2, 4, 2, {}});
  EXPECT_FALSE(check_schedule(s, {2}));
  const auto e = check_schedule(s, {1});
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("deadlock: rank 0 action"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("(0SEND_F3: stage 0, microbatch 3) waits for rank 1 to receive one "
                            "of 1 earlier messages"),
            std::string::npos)
      << e->message;
  EXPECT_NE(e->message.find("(1SEND_F2: stage 1, microbatch 2) waits for rank 0 to receive"),
            std::string::npos)
      << e->message;
}

}  // namespace
}  // namespace tspemu::pipeline
