// The static schedule checker (plan/pipeline_check.hpp) on planted bugs: each is caught by the
// rule meant for it and named with its rank, action index, stage and microbatch — a W before its
// I, a send to the wrong stage, a microbatch missing, orders that deadlock (including the
// criss-crossed sends that hang only when sends block), a per-pair FIFO swap and a shape
// mismatch (Megatron's PP=2 bug), unmatched sends, duplicates, a gradient reduction too early.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan_test_shapes.hpp"
#include "tspemu/plan/pipeline_check.hpp"
#include "tspemu/plan/pipeline_schedule.hpp"

namespace tspemu::pipeline {
namespace {

using plan_testing::kShape;

Schedule make(Kind k, int p, int m, int v = 1) {
  return make_schedule({k, p, m, v, kShape});
}

// The index of the action spelled `text` in rank's list (a test failure when absent).
int index_of(const Schedule& s, int rank, const std::string& text) {
  const auto& list = s.actions.at(rank);
  for (std::size_t i = 0; i < list.size(); ++i)
    if (to_string(list[i]) == text) return static_cast<int>(i);
  ADD_FAILURE() << "no " << text << " on rank " << rank;
  return 0;
}

// Moves rank's action at `from` to position `to` (the others keep their order).
void move(Schedule& s, int rank, int from, int to) {
  auto& list = s.actions.at(rank);
  const Action a = list.at(from);
  list.erase(list.begin() + from);
  list.insert(list.begin() + to, a);
}

// The checker's issue, which must exist and sit at (rank, index, stage, microbatch) with a
// message holding each piece of `expected`.
void expect_issue(const Schedule& s, int rank, int index, int stage, int mb,
                  const std::vector<std::string>& expected, const CheckOptions& opt = {}) {
  const auto e = check_schedule(s, opt);
  ASSERT_TRUE(e) << "no issue found";
  EXPECT_EQ(e->rank, rank) << e->message;
  EXPECT_EQ(e->index, index) << e->message;
  EXPECT_EQ(e->stage, stage) << e->message;
  EXPECT_EQ(e->microbatch, mb) << e->message;
  for (const auto& piece : expected)
    EXPECT_NE(e->message.find(piece), std::string::npos) << "'" << piece << "' not in\n"
                                                         << e->message;
  EXPECT_THROW(require_valid(s, opt), std::invalid_argument);
}

TEST(PipelineCheck, WeightPassBeforeItsInputGradientPass) {
  Schedule s = make(Kind::zb_h1, 3, 4);
  ASSERT_FALSE(check_schedule(s));
  const int i = index_of(s, 1, "1I0");
  move(s, 1, index_of(s, 1, "1W0"), i);
  expect_issue(s, 1, i, 1, 0,
               {"rank 1 action " + std::to_string(i) + " (1W0: stage 1, microbatch 0)",
                "runs before its input-gradient pass: no earlier 1I0"});
}

TEST(PipelineCheck, SendToTheWrongStage) {
  Schedule s = make(Kind::one_f_one_b, 4, 4);
  const int i = index_of(s, 0, "0SEND_F1");
  s.actions[0][i].peer_stage = 2;
  expect_issue(s, 0, i, 0, 1,
               {"rank 0 action " + std::to_string(i) + " (0SEND_F1: stage 0, microbatch 1)",
                "sends to stage 2; a SEND_F of stage 0 talks to stage 1"});
}

TEST(PipelineCheck, MissingMicrobatch) {
  Schedule s = make(Kind::one_f_one_b, 3, 4);
  std::erase_if(s.actions[1], [](const Action& a) { return a.microbatch == 2; });
  expect_issue(s, 1, -1, 1, 2, {"stage 1, microbatch 2 (rank 1): no forward F"});
}

TEST(PipelineCheck, MissingWeightPassAndDoubleBackward) {
  Schedule s = make(Kind::zb_h1, 2, 3);
  s.actions[0].erase(s.actions[0].begin() + index_of(s, 0, "0W2"));
  expect_issue(s, 0, -1, 0, 2, {"stage 0, microbatch 2 (rank 0): an I but no weight-gradient"});
  Schedule t = make(Kind::zb_h1, 2, 3);
  t.actions[1].push_back(parse_action("1B1"));
  expect_issue(t, 1, -1, 1, 1, {"both a full backward B (action"});
}

TEST(PipelineCheck, ActionRunTwice) {
  Schedule s = make(Kind::gpipe, 2, 3);
  const int first = index_of(s, 0, "0F1");
  s.actions[0].insert(s.actions[0].begin() + first + 1, parse_action("0F1"));
  expect_issue(
      s, 0, first + 1, 0, 1,
      {"(0F1: stage 0, microbatch 1): runs twice (first at action " + std::to_string(first) + ")"});
}

std::vector<Action> parse_row(const std::vector<std::string>& texts) {
  std::vector<Action> out;
  out.reserve(texts.size());
  for (const auto& t : texts) out.push_back(parse_action(t, kShape));
  return out;
}

// Rank 0 waits for microbatch 0's gradient before sending microbatch 1 forward, while the last
// stage runs microbatch 1 forward before microbatch 0's backward: each waits for the other.
TEST(PipelineCheck, DeadlockingOrderNamesEveryStuckRank) {
  Schedule s = make(Kind::one_f_one_b, 2, 3);
  s.actions[0] = parse_row({"0F0", "0SEND_F0", "0RECV_B0", "0B0", "0F1", "0SEND_F1", "0RECV_B1",
                            "0B1", "0F2", "0SEND_F2", "0RECV_B2", "0B2"});
  s.actions[1] = parse_row({"1RECV_F0", "1F0", "1RECV_F1", "1F1", "1B0", "1SEND_B0", "1RECV_F2",
                            "1F2", "1B1", "1SEND_B1", "1B2", "1SEND_B2"});
  expect_issue(s, 0, 3, 0, 0,
               {"deadlock: rank 0 action 3 (0B0: stage 0, microbatch 0) waits for its input from "
                "rank 1 (1SEND_B0: stage 1, microbatch 0 at its action 5, not yet sent); rank 1 "
                "is at action 3 (1F1: stage 1, microbatch 1)",
                "; rank 1 action 3 (1F1: stage 1, microbatch 1) waits for its input from rank 0 "
                "(0SEND_F1: stage 0, microbatch 1 at its action 5, not yet sent); rank 0 is at "
                "action 3 (0B0: stage 0, microbatch 0)"});
}

// PyTorch's placement (send after produce, receives posted early, each consumer waiting for its
// message) is fine while a send returns at once, and hangs when a send blocks until received:
// each side sends before consuming the other's (the criss-crossed sends of PyTorch PR 127332).
TEST(PipelineCheck, CrissCrossedSendsDeadlockOnlyWhenSendsBlock) {
  const Schedule s = make(Kind::one_f_one_b, 2, 2);
  EXPECT_FALSE(check_schedule(s, {4}));
  EXPECT_FALSE(check_schedule(s, {1}));
  expect_issue(s, 0, 3, 0, 1,
               {"deadlock: rank 0 action 3 (0SEND_F1: stage 0, microbatch 1) waits for rank 1 "
                "to receive it (sends block until received); rank 1 is at action 4 (1SEND_B0",
                "rank 1 action 4 (1SEND_B0: stage 1, microbatch 0) waits for rank 0 to receive "
                "it"},
               {0});
}

// Per-pair FIFO: swapping two sends makes the first recv take the wrong microbatch.
TEST(PipelineCheck, SwappedSendsAreAMismatchNamingBothEnds) {
  Schedule s = make(Kind::one_f_one_b, 2, 3);
  move(s, 0, index_of(s, 0, "0SEND_F0"), index_of(s, 0, "0SEND_F1"));
  const int recv = index_of(s, 1, "1RECV_F0");
  expect_issue(s, 1, recv, 1, 0,
               {"rank 1 action " + std::to_string(recv) + " (1RECV_F0: stage 1, microbatch 0)",
                "receives rank 0 action " + std::to_string(index_of(s, 0, "0SEND_F1")) +
                    " (0SEND_F1: stage 0, microbatch 1)",
                "messages from rank 0 to rank 1 match in order", "carries microbatch 1"});
}

TEST(PipelineCheck, ShapeMismatchNamesBothShapes) {
  Schedule s = make(Kind::interleaved_1f1b, 2, 4, 2);
  const int send = index_of(s, 1, "1SEND_F2");
  s.actions[1][send].shape = {2, 8, 32};
  const int recv = index_of(s, 0, "2RECV_F2");
  expect_issue(
      s, 0, recv, 2, 2,
      {"(2RECV_F2: stage 2, microbatch 2)", "receives rank 1 action " + std::to_string(send),
       "shape [2, 8, 32] sent, [2, 8, 16] expected"});
}

TEST(PipelineCheck, UnmatchedSendAndRecv) {
  Schedule s = make(Kind::gpipe, 3, 2);
  s.actions[2].erase(s.actions[2].begin() + index_of(s, 2, "2RECV_F1"));
  const int send = index_of(s, 1, "1SEND_F1");
  expect_issue(s, 1, send, 1, 1,
               {"(1SEND_F1: stage 1, microbatch 1): unmatched send: rank 2 has no 2RECV_F1"});
  Schedule t = make(Kind::gpipe, 3, 2);
  t.actions[0].erase(t.actions[0].begin() + index_of(t, 0, "0SEND_F0"));
  expect_issue(t, 1, index_of(t, 1, "1RECV_F0"), 1, 0,
               {"unmatched recv: rank 0 has no 0SEND_F0 to send it"});
}

TEST(PipelineCheck, ForwardBeforeItsInputAndBackwardBeforeItsGradient) {
  Schedule s = make(Kind::gpipe, 2, 2);
  move(s, 1, index_of(s, 1, "1F1"), 0);
  expect_issue(s, 1, 0, 1, 1,
               {"(1F1: stage 1, microbatch 1): runs before its input: no earlier "
                "1RECV_F1"});
  Schedule t = make(Kind::gpipe, 2, 2);
  const int recv = index_of(t, 0, "0RECV_B0");
  move(t, 0, index_of(t, 0, "0B0"), recv);
  expect_issue(t, 0, recv, 0, 0, {"runs before its output gradient: no earlier 0RECV_B0"});
}

TEST(PipelineCheck, GradientReductionBeforeTheLastBackward) {
  Schedule s = make(Kind::one_f_one_b, 2, 3);
  const int last = index_of(s, 0, "0B2");
  s.actions[0].insert(s.actions[0].begin() + last, parse_action("0REDUCE_GRAD"));
  expect_issue(s, 0, last, 0, -1,
               {"(0REDUCE_GRAD: stage 0): reduces the gradients before the last backward of "
                "microbatch 2 (action " +
                std::to_string(last + 1) + ")"});
  s.actions[0].erase(s.actions[0].begin() + last);
  s.actions[0].push_back(parse_action("0REDUCE_GRAD"));
  EXPECT_FALSE(check_schedule(s));
}

TEST(PipelineCheck, StageOnTheWrongRankAndMalformedTable) {
  Schedule s = make(Kind::gpipe, 2, 2);
  s.actions[0].push_back(parse_action("1W0"));
  expect_issue(s, 0, static_cast<int>(s.actions[0].size()) - 1, 1, 0,
               {"stage 1 runs on rank 1, not rank 0"});
  Schedule t = make(Kind::gpipe, 2, 2);
  t.actions.pop_back();
  expect_issue(t, -1, -1, -1, -1, {"the schedule has 1 rows for 2 ranks"});
  Schedule u = make(Kind::gpipe, 2, 2);
  u.actions[1][0].microbatch = 7;
  expect_issue(u, 1, 0, 1, 7, {"microbatch outside [0, 2)"});
}

}  // namespace
}  // namespace tspemu::pipeline
