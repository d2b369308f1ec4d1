#include "tspemu/plan/pipeline_clock.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "pipeline_messages.hpp"
#include "tspemu/plan/pipeline_check.hpp"

namespace tspemu::pipeline {

namespace {

std::int64_t cost_of(Op op, const Costs& c) {
  switch (op) {
    case Op::forward:
      return c.forward;
    case Op::backward:
      return c.backward;
    case Op::backward_input:
      return c.backward_input;
    case Op::backward_weight:
      return c.backward_weight;
    default:
      return 0;
  }
}

// Each stage's, and each rank's, most activations held at once along the rank's order.
void peaks(const Schedule& s, Timeline& t) {
  std::vector<int> held(s.stages, 0);
  t.peak_in_flight.assign(s.stages, 0);
  t.rank_peak_in_flight.assign(s.ranks, 0);
  for (int r = 0; r < s.ranks; ++r) {
    int rank_held = 0;
    for (const Action& a : s.actions[r]) {
      if (a.op == Op::forward) {
        t.peak_in_flight[a.stage] = std::max(t.peak_in_flight[a.stage], ++held[a.stage]);
        t.rank_peak_in_flight[r] = std::max(t.rank_peak_in_flight[r], ++rank_held);
      }
      if (a.op == Op::backward || a.op == Op::backward_weight) {
        --held[a.stage];
        --rank_held;
      }
    }
  }
}

// The clock's state: each rank's time and next action, each SEND's post time (-1: not yet).
struct Clock {
  const Schedule& s;
  const Costs& c;
  const detail::Messages msg;
  std::vector<std::size_t> pc;
  std::vector<std::int64_t> now;
  std::vector<std::vector<std::int64_t>> posted;
  Clock(const Schedule& sched, const Costs& costs)
      : s(sched),
        c(costs),
        msg(detail::link_messages(sched)),
        pc(sched.ranks, 0),
        now(sched.ranks, 0) {
    for (const auto& list : sched.actions) posted.emplace_back(list.size(), -1);
  }
};

// Runs rank r's next action if it can (a consumer waits for its message); true when it did.
bool advance(Clock& k, int r, Timeline& t) {
  const int i = static_cast<int>(k.pc[r]);
  const Action& a = k.s.actions[r][i];
  if (a.op == Op::send_f || a.op == Op::send_b) k.posted[r][i] = k.now[r];
  if (const int j = k.msg.consumes[r][i]; j >= 0) {
    const detail::End e = k.msg.other_end[r][j];
    const std::int64_t sent = k.posted[e.rank][e.index];
    if (sent < 0) return false;
    k.now[r] = std::max(k.now[r], sent + k.c.message);
  }
  k.now[r] += cost_of(a.op, k.c);
  t.busy[r] += cost_of(a.op, k.c);
  ++k.pc[r];
  return true;
}

}  // namespace

Fraction Fraction::of(std::int64_t num, std::int64_t den) {
  if (den <= 0)
    throw std::invalid_argument("Fraction: denominator " + std::to_string(den) + " <= 0");
  const std::int64_t g = std::gcd(num, den);
  return g == 0 ? Fraction{0, 1} : Fraction{num / g, den / g};
}

std::string to_string(const Fraction& f) {
  return std::to_string(f.num) + "/" + std::to_string(f.den);
}

Fraction Timeline::idle_fraction(int rank) const {
  return Fraction::of(makespan - busy.at(rank), makespan);
}

Timeline simulate(const Schedule& s, const Costs& costs) {
  require_valid(s, {std::numeric_limits<int>::max()});
  Timeline t;
  t.busy.assign(s.ranks, 0);
  Clock k(s, costs);
  // The checker's dry run proved every rank finishes when no send blocks.
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.ranks; ++r)
      while (k.pc[r] < s.actions[r].size() && advance(k, r, t)) progress = true;
  }
  t.finish = k.now;
  t.makespan = *std::max_element(k.now.begin(), k.now.end());
  if (t.makespan <= 0) throw std::invalid_argument("simulate: the schedule takes no time");
  peaks(s, t);
  return t;
}

std::optional<Fraction> closed_form_bubble(Kind kind, int p, int m, int v, const Costs& c) {
  const std::int64_t p1 = p - 1;
  switch (kind) {
    case Kind::gpipe:
    case Kind::one_f_one_b:
      return Fraction::of(p1, m + p1);
    case Kind::interleaved_1f1b:
      if (m < p) return std::nullopt;
      return Fraction::of(p1, static_cast<std::int64_t>(v) * m + p1);
    case Kind::zb_h1: {
      if (m < p) return std::nullopt;
      const std::int64_t idle = p1 * (c.forward + c.backward_input - c.backward_weight);
      const std::int64_t busy =
          static_cast<std::int64_t>(m) * (c.forward + c.backward_input + c.backward_weight);
      return Fraction::of(idle, busy + idle);
    }
  }
  return std::nullopt;
}

}  // namespace tspemu::pipeline
