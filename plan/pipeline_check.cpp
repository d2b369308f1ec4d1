#include "tspemu/plan/pipeline_check.hpp"

#include "pipeline_messages.hpp"

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <vector>

namespace tspemu::pipeline {

namespace {

using Issue = std::optional<ScheduleIssue>;
constexpr int kOps = static_cast<int>(Op::reduce_grad) + 1;

std::string describe(const Action& a) {
  std::string s = to_string(a) + ": stage " + std::to_string(a.stage);
  if (!is_marker(a.op)) s += ", microbatch " + std::to_string(a.microbatch);
  return s;
}

std::string at(int rank, int index, const Action& a) {
  return "rank " + std::to_string(rank) + " action " + std::to_string(index) + " (" + describe(a) +
         ")";
}

ScheduleIssue issue(int rank, int index, const Action& a, const std::string& what) {
  return {rank, index, a.stage, is_marker(a.op) ? -1 : a.microbatch,
          at(rank, index, a) + ": " + what};
}

// The first index of each (op, stage, microbatch) on its stage's rank (markers: microbatch 0),
// -1 when absent; filled by check_once.
struct Index {
  int stages = 0;
  int m = 0;
  std::vector<int> first;
  Index(int s, int microbatches)
      : stages(s), m(microbatches), first(static_cast<std::size_t>(kOps) * s * m, -1) {}
  int& operator()(Op op, int stage, int mb) {
    return first[(static_cast<std::size_t>(op) * stages + stage) * m + std::max(mb, 0)];
  }
};

Issue check_table(const Schedule& s) {
  const auto table = [](const std::string& what) { return ScheduleIssue{-1, -1, -1, -1, what}; };
  if (s.ranks < 1) return table("the schedule has " + std::to_string(s.ranks) + " ranks");
  if (s.microbatches < 1)
    return table("the schedule has " + std::to_string(s.microbatches) + " microbatches");
  if (static_cast<int>(s.actions.size()) != s.ranks)
    return table("the schedule has " + std::to_string(s.actions.size()) + " rows for " +
                 std::to_string(s.ranks) + " ranks");
  if (s.stages < 1 || static_cast<int>(s.stage_rank.size()) != s.stages)
    return table("the stage-to-rank map has " + std::to_string(s.stage_rank.size()) +
                 " entries for " + std::to_string(s.stages) + " stages");
  for (int k = 0; k < s.stages; ++k)
    if (s.stage_rank[k] < 0 || s.stage_rank[k] >= s.ranks)
      return table("stage " + std::to_string(k) + " maps to rank " +
                   std::to_string(s.stage_rank[k]) + ", outside [0, " + std::to_string(s.ranks) +
                   ")");
  return std::nullopt;
}

Issue check_fields(const Schedule& s, int r, int i, const Action& a) {
  if (a.stage < 0 || a.stage >= s.stages)
    return issue(r, i, a,
                 "no stage " + std::to_string(a.stage) + " (stages 0.." +
                     std::to_string(s.stages - 1) + ")");
  if (s.stage_rank[a.stage] != r)
    return issue(r, i, a,
                 "stage " + std::to_string(a.stage) + " runs on rank " +
                     std::to_string(s.stage_rank[a.stage]) + ", not rank " + std::to_string(r));
  if (!is_marker(a.op) && (a.microbatch < 0 || a.microbatch >= s.microbatches))
    return issue(r, i, a, "microbatch outside [0, " + std::to_string(s.microbatches) + ")");
  if (!is_comm(a.op)) return std::nullopt;
  const int want = default_peer_stage(a.op, a.stage);
  const bool sends = a.op == Op::send_f || a.op == Op::send_b;
  if (a.peer_stage != want)
    return issue(r, i, a,
                 std::string(sends ? "sends to" : "receives from") + " stage " +
                     std::to_string(a.peer_stage) + "; a " + op_name(a.op) + " of stage " +
                     std::to_string(a.stage) + " talks to stage " + std::to_string(want));
  if (want < 0 || want >= s.stages)
    return issue(r, i, a,
                 "stage " + std::to_string(a.stage) + " has no stage " + std::to_string(want) +
                     " to talk to");
  if (s.stage_rank[want] == r)
    return issue(r, i, a,
                 "stage " + std::to_string(want) + " is on the same rank " + std::to_string(r) +
                     " (no message needed)");
  return std::nullopt;
}

// Fills `idx`; reports an action run twice.
Issue check_duplicates(const Schedule& s, Index& idx) {
  for (int r = 0; r < s.ranks; ++r)
    for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
      const Action& a = s.actions[r][i];
      if (a.op == Op::unshard || a.op == Op::reshard) continue;
      int& first = idx(a.op, a.stage, a.microbatch);
      if (first >= 0)
        return issue(r, i, a, "runs twice (first at action " + std::to_string(first) + ")");
      first = i;
    }
  return std::nullopt;
}

// Every (stage, microbatch) has one F and either one B or one I and one W.
Issue check_complete(const Schedule& s, Index& idx) {
  for (int k = 0; k < s.stages; ++k)
    for (int mb = 0; mb < s.microbatches; ++mb) {
      const int r = s.stage_rank[k];
      const auto missing = [&](const std::string& what) {
        return ScheduleIssue{r, -1, k, mb,
                             "stage " + std::to_string(k) + ", microbatch " + std::to_string(mb) +
                                 " (rank " + std::to_string(r) + "): " + what};
      };
      const int b = idx(Op::backward, k, mb);
      const int in = idx(Op::backward_input, k, mb);
      const int w = idx(Op::backward_weight, k, mb);
      if (idx(Op::forward, k, mb) < 0) return missing("no forward F");
      if (b >= 0 && (in >= 0 || w >= 0))
        return missing("both a full backward B (action " + std::to_string(b) +
                       ") and a split one (I/W)");
      if (b < 0 && in < 0 && w < 0) return missing("no backward (B, or I and W)");
      if (b < 0 && in < 0) return missing("a W but no input-gradient pass I");
      if (b < 0 && w < 0) return missing("an I but no weight-gradient pass W");
    }
  return std::nullopt;
}

Op partner(Op op) {
  switch (op) {
    case Op::send_f:
      return Op::recv_f;
    case Op::recv_f:
      return Op::send_f;
    case Op::send_b:
      return Op::recv_b;
    default:
      return Op::send_b;
  }
}

// Every SEND has its RECV and every RECV its SEND (peers already checked to be adjacent).
Issue check_pairing(const Schedule& s, Index& idx) {
  for (int r = 0; r < s.ranks; ++r)
    for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
      const Action& a = s.actions[r][i];
      if (!is_comm(a.op)) continue;
      const Op other = partner(a.op);
      if (idx(other, a.peer_stage, a.microbatch) >= 0) continue;
      const Action want{other, a.peer_stage, a.microbatch, a.stage, a.shape};
      const bool sends = a.op == Op::send_f || a.op == Op::send_b;
      return issue(r, i, a,
                   std::string(sends ? "unmatched send: rank " : "unmatched recv: rank ") +
                       std::to_string(s.stage_rank[a.peer_stage]) + " has no " + to_string(want) +
                       (sends ? " to receive it" : " to send it"));
    }
  return std::nullopt;
}

// The happens-before rule of one action on its rank: nullopt, or what is missing before it.
std::optional<std::string> missing_before(const Schedule& s, int r, int i, const Action& a,
                                          Index& idx) {
  const int k = a.stage;
  const int mb = a.microbatch;
  const auto before = [&](Op op, int stage) {
    const int j = idx(op, stage, mb);
    return j >= 0 && j < i;
  };
  const auto name = [&](Op op, int stage) { return to_string(Action{op, stage, mb, -1, {}}); };
  const auto grad_done = [&](int stage) {
    return before(Op::backward, stage) || before(Op::backward_input, stage);
  };
  switch (a.op) {
    case Op::forward:
      if (k == 0) return std::nullopt;
      if (s.stage_rank[k - 1] == r)
        return before(Op::forward, k - 1)
                   ? std::nullopt
                   : std::optional("its input: no earlier " + name(Op::forward, k - 1));
      return before(Op::recv_f, k) ? std::nullopt
                                   : std::optional("its input: no earlier " + name(Op::recv_f, k));
    case Op::backward:
    case Op::backward_input:
      if (!before(Op::forward, k)) return "its forward: no earlier " + name(Op::forward, k);
      if (k == s.stages - 1) return std::nullopt;
      if (s.stage_rank[k + 1] == r)
        return grad_done(k + 1)
                   ? std::nullopt
                   : std::optional("its output gradient: no earlier " + name(Op::backward, k + 1) +
                                   " or " + name(Op::backward_input, k + 1));
      return before(Op::recv_b, k)
                 ? std::nullopt
                 : std::optional("its output gradient: no earlier " + name(Op::recv_b, k));
    case Op::backward_weight:
      return before(Op::backward_input, k)
                 ? std::nullopt
                 : std::optional("its input-gradient pass: no earlier " +
                                 name(Op::backward_input, k) + " (a W runs after its I)");
    case Op::send_f:
      return before(Op::forward, k)
                 ? std::nullopt
                 : std::optional("what it sends: no earlier " + name(Op::forward, k));
    case Op::send_b:
      return grad_done(k) ? std::nullopt
                          : std::optional("what it sends: no earlier " + name(Op::backward, k) +
                                          " or " + name(Op::backward_input, k));
    default:
      return std::nullopt;
  }
}

Issue check_order(const Schedule& s, Index& idx) {
  for (int r = 0; r < s.ranks; ++r)
    for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
      const Action& a = s.actions[r][i];
      if (auto why = missing_before(s, r, i, a, idx)) return issue(r, i, a, "runs before " + *why);
      if (a.op != Op::reduce_grad) continue;
      for (int mb = 0; mb < s.microbatches; ++mb) {
        const int last =
            std::max(idx(Op::backward, a.stage, mb), idx(Op::backward_weight, a.stage, mb));
        if (last > i)
          return issue(r, i, a,
                       "reduces the gradients before the last backward of microbatch " +
                           std::to_string(mb) + " (action " + std::to_string(last) + ")");
      }
    }
  return std::nullopt;
}

// ---- Message matching and the dry run ------------------------------------------------------

// Per-pair FIFO: each RECV must be the message its matched SEND carries.
Issue check_matching(const Schedule& s, const detail::Messages& msg) {
  for (int r = 0; r < s.ranks; ++r)
    for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
      const Action& ra = s.actions[r][i];
      if (ra.op != Op::recv_f && ra.op != Op::recv_b) continue;
      const auto [from, j] = msg.other_end[r][i];
      const Action& sa = s.actions[from][j];
      std::string diff;
      if (partner(sa.op) != ra.op) diff += "; the message is a " + std::string(op_name(sa.op));
      if (sa.peer_stage != ra.stage || ra.peer_stage != sa.stage)
        diff += "; it goes from stage " + std::to_string(sa.stage) + " to stage " +
                std::to_string(sa.peer_stage);
      if (sa.microbatch != ra.microbatch)
        diff += "; it carries microbatch " + std::to_string(sa.microbatch);
      if (!(sa.shape == ra.shape))
        diff += "; shape " + to_string(sa.shape) + " sent, " + to_string(ra.shape) + " expected";
      if (!diff.empty())
        return issue(r, i, ra,
                     "receives " + at(from, j, sa) + " (messages from rank " +
                         std::to_string(from) + " to rank " + std::to_string(r) +
                         " match in order)" + diff);
    }
  return std::nullopt;
}

struct DryRun {
  const Schedule& s;
  const CheckOptions& opt;
  const detail::Messages& msg;
  std::vector<std::size_t> pc;              // rank -> its next action
  std::vector<std::vector<char>> sent;      // rank -> action -> SEND posted
  std::vector<std::vector<char>> consumed;  // rank -> action -> RECV's message consumed
  std::vector<int> in_flight;               // from * p + to -> sent, not yet consumed
  DryRun(const Schedule& sched, const CheckOptions& o, const detail::Messages& m)
      : s(sched),
        opt(o),
        msg(m),
        pc(sched.ranks, 0),
        in_flight(static_cast<std::size_t>(sched.ranks) * sched.ranks, 0) {
    for (const auto& list : sched.actions) {
      sent.emplace_back(list.size(), 0);
      consumed.emplace_back(list.size(), 0);
    }
  }
  bool done(int r) const { return pc[r] == s.actions[r].size(); }
  std::string where(int r) const {
    return done(r)
               ? "finished"
               : "at action " + std::to_string(pc[r]) + " (" + describe(s.actions[r][pc[r]]) + ")";
  }
};

// Runs rank r's next action if it can; true when it moved (posting a blocking send counts).
bool step(DryRun& d, int r) {
  const int i = static_cast<int>(d.pc[r]);
  const Action& a = d.s.actions[r][i];
  if (a.op == Op::send_f || a.op == Op::send_b) {
    const auto [to, j] = d.msg.other_end[r][i];
    int& flight = d.in_flight[r * d.s.ranks + to];
    if (d.opt.sends_in_flight > 0 && flight >= d.opt.sends_in_flight) return false;
    if (d.sent[r][i] == 0) {
      d.sent[r][i] = 1;
      ++flight;
      if (d.opt.sends_in_flight == 0) return true;  // posted; now wait until consumed
    } else if (d.consumed[to][j] == 0) {
      return false;
    }
  } else if (const int j = d.msg.consumes[r][i]; j >= 0) {
    const auto [from, k] = d.msg.other_end[r][j];
    if (d.sent[from][k] == 0) return false;
    d.consumed[r][j] = 1;
    --d.in_flight[from * d.s.ranks + r];
  }
  ++d.pc[r];
  return true;
}

// What the stuck rank r waits for, in words.
std::string stuck_reason(const DryRun& d, int r) {
  const int i = static_cast<int>(d.pc[r]);
  const Action& a = d.s.actions[r][i];
  if (a.op == Op::send_f || a.op == Op::send_b) {
    const int to = d.msg.other_end[r][i].rank;
    if (d.opt.sends_in_flight == 0)
      return "waits for rank " + std::to_string(to) +
             " to receive it (sends block until received); rank " + std::to_string(to) + " is " +
             d.where(to);
    return "waits for rank " + std::to_string(to) + " to receive one of " +
           std::to_string(d.opt.sends_in_flight) + " earlier messages (sends_in_flight); rank " +
           std::to_string(to) + " is " + d.where(to);
  }
  const auto [from, k] = d.msg.other_end[r][d.msg.consumes[r][i]];
  return "waits for its input from rank " + std::to_string(from) + " (" +
         describe(d.s.actions[from][k]) + " at its action " + std::to_string(k) +
         ", not yet sent); rank " + std::to_string(from) + " is " + d.where(from);
}

Issue deadlock(const DryRun& d) {
  std::optional<ScheduleIssue> first;
  std::string all;
  for (int r = 0; r < d.s.ranks; ++r) {
    if (d.done(r)) continue;
    const int i = static_cast<int>(d.pc[r]);
    const Action& a = d.s.actions[r][i];
    all += (all.empty() ? "" : "; ") + at(r, i, a) + " " + stuck_reason(d, r);
    if (!first) first = issue(r, i, a, "");
  }
  first->message = "deadlock: " + all;
  return first;
}

Issue dry_run(const Schedule& s, const CheckOptions& opt, const detail::Messages& msg) {
  DryRun d(s, opt, msg);
  for (;;) {
    bool progress = false;
    bool finished = true;
    for (int r = 0; r < s.ranks; ++r) {
      while (!d.done(r) && step(d, r)) progress = true;
      finished = finished && d.done(r);
    }
    if (finished) return std::nullopt;
    if (!progress) return deadlock(d);
  }
}

}  // namespace

std::optional<ScheduleIssue> check_schedule(const Schedule& s, const CheckOptions& opt) {
  if (auto e = check_table(s)) return e;
  for (int r = 0; r < s.ranks; ++r)
    for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i)
      if (auto e = check_fields(s, r, i, s.actions[r][i])) return e;
  Index idx(s.stages, s.microbatches);
  if (auto e = check_duplicates(s, idx)) return e;
  if (auto e = check_complete(s, idx)) return e;
  if (auto e = check_pairing(s, idx)) return e;
  if (auto e = check_order(s, idx)) return e;
  const detail::Messages msg = detail::link_messages(s);
  if (auto e = check_matching(s, msg)) return e;
  return dry_run(s, opt, msg);
}

void require_valid(const Schedule& s, const CheckOptions& opt) {
  if (const auto e = check_schedule(s, opt)) throw std::invalid_argument(e->message);
}

}  // namespace tspemu::pipeline
