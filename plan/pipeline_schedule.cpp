#include "tspemu/plan/pipeline_schedule.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <stdexcept>
#include <utility>

namespace tspemu::pipeline {

namespace {

struct OpSpelling {
  Op op;
  const char* name;
};
// Longest first, so parsing takes "SEND_F" before "F" would match a prefix of something else.
constexpr std::array<OpSpelling, 11> kSpellings{{{Op::reduce_grad, "REDUCE_GRAD"},
                                                 {Op::unshard, "UNSHARD"},
                                                 {Op::reshard, "RESHARD"},
                                                 {Op::send_f, "SEND_F"},
                                                 {Op::recv_f, "RECV_F"},
                                                 {Op::send_b, "SEND_B"},
                                                 {Op::recv_b, "RECV_B"},
                                                 {Op::forward, "F"},
                                                 {Op::backward, "B"},
                                                 {Op::backward_input, "I"},
                                                 {Op::backward_weight, "W"}}};

// Reads a run of decimal digits at text[pos...]; -1 when there is none. Throws past int range.
int read_number(std::string_view text, std::size_t& pos, std::string_view whole) {
  const std::size_t start = pos;
  long long v = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])) != 0) {
    v = v * 10 + (text[pos] - '0');
    if (v > 1'000'000'000)
      throw std::invalid_argument("pipeline action '" + std::string(whole) +
                                  "': number out of range");
    ++pos;
  }
  return pos == start ? -1 : static_cast<int>(v);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

Action compute(Op op, int stage, int mb) {
  return Action{op, stage, mb, -1, {}};
}

// ---- The compute order of each schedule, per rank ----------------------------------------

std::vector<Action> gpipe_rank(int r, int m) {
  std::vector<Action> a;
  a.reserve(2 * static_cast<std::size_t>(m));
  for (int i = 0; i < m; ++i) a.push_back(compute(Op::forward, r, i));
  for (int i = 0; i < m; ++i) a.push_back(compute(Op::backward, r, i));
  return a;
}

std::vector<Action> one_f_one_b_rank(int r, int p, int m) {
  const int w = std::min(p - r - 1, m);
  std::vector<Action> a;
  a.reserve(2 * static_cast<std::size_t>(m));
  for (int i = 0; i < w; ++i) a.push_back(compute(Op::forward, r, i));
  for (int i = 0; i < m - w; ++i) {
    a.push_back(compute(Op::forward, r, w + i));
    a.push_back(compute(Op::backward, r, i));
  }
  for (int i = m - w; i < m; ++i) a.push_back(compute(Op::backward, r, i));
  return a;
}

std::vector<Action> interleaved_rank(int r, int p, int m, int v) {
  const int rounds = std::max(1, m / p);
  const int g = m / rounds;  // microbatches per round
  const int total = v * m;
  const int w = std::min((v - 1) * g + 2 * (p - 1 - r), total);
  const auto mb = [&](int k) { return (k / (g * v)) * g + k % g; };
  const auto fwd = [&](int k) { return compute(Op::forward, ((k / g) % v) * p + r, mb(k)); };
  const auto bwd = [&](int k) {
    return compute(Op::backward, (v - 1 - (k / g) % v) * p + r, mb(k));
  };
  std::vector<Action> a;
  a.reserve(2 * static_cast<std::size_t>(total));
  for (int k = 0; k < w; ++k) a.push_back(fwd(k));
  for (int i = 0; i < total - w; ++i) {
    a.push_back(fwd(w + i));
    a.push_back(bwd(i));
  }
  for (int i = total - w; i < total; ++i) a.push_back(bwd(i));
  return a;
}

std::vector<Action> zb_h1_rank(int r, int p, int m) {
  const int w = std::min(p - 1 - r, m);
  std::vector<Action> a;
  int next_w = 0;
  const auto input_then_weight = [&](int i) {
    a.push_back(compute(Op::backward_input, r, i));
    if (i >= r) a.push_back(compute(Op::backward_weight, r, next_w++));
  };
  for (int i = 0; i < w; ++i) a.push_back(compute(Op::forward, r, i));
  for (int i = 0; i < m - w; ++i) {
    a.push_back(compute(Op::forward, r, w + i));
    input_then_weight(i);
  }
  for (int i = m - w; i < m; ++i) input_then_weight(i);
  while (next_w < m) a.push_back(compute(Op::backward_weight, r, next_w++));
  return a;
}

// ---- lower_send_recv ------------------------------------------------------------------------

// Per (stage, microbatch) flags of what lowering has placed so far.
struct Placed {
  int m = 0;
  std::vector<char> forward, backward_in, recv_f, recv_b;  // backward_in: B or I placed
  Placed(int stages, int microbatches)
      : m(microbatches),
        forward(static_cast<std::size_t>(stages) * microbatches),
        backward_in(forward.size()),
        recv_f(forward.size()),
        recv_b(forward.size()) {}
  std::size_t at(int stage, int mb) const { return static_cast<std::size_t>(stage) * m + mb; }
};

// What a's input waits for before lowering can place it, or "" when it is ready.
std::string waiting_for(const Schedule& s, int rank, const Action& a, const Placed& placed) {
  const int st = a.stage;
  const int mb = a.microbatch;
  if (a.op == Op::forward && st > 0) {
    const bool local = s.stage_rank[st - 1] == rank;
    if (local ? placed.forward[placed.at(st - 1, mb)] : placed.recv_f[placed.at(st, mb)]) return "";
    return "stage " + std::to_string(st - 1) + "'s forward of microbatch " + std::to_string(mb);
  }
  if ((a.op == Op::backward || a.op == Op::backward_input) && st < s.stages - 1) {
    const bool local = s.stage_rank[st + 1] == rank;
    if (local ? placed.backward_in[placed.at(st + 1, mb)] : placed.recv_b[placed.at(st, mb)])
      return "";
    return "stage " + std::to_string(st + 1) + "'s backward of microbatch " + std::to_string(mb);
  }
  return "";
}

void check_compute_action(const Schedule& s, int rank, std::size_t i, const Action& a) {
  const auto where =
      "rank " + std::to_string(rank) + " action " + std::to_string(i) + " (" + to_string(a) + ")";
  if (is_comm(a.op))
    throw std::invalid_argument("lower_send_recv: " + where +
                                " is a send/recv; the table must be compute-only");
  if (a.stage < 0 || a.stage >= s.stages || s.stage_rank[a.stage] != rank)
    throw std::invalid_argument("lower_send_recv: " + where + ": stage " + std::to_string(a.stage) +
                                " is not a stage of rank " + std::to_string(rank));
  if (!is_marker(a.op) && (a.microbatch < 0 || a.microbatch >= s.microbatches))
    throw std::invalid_argument("lower_send_recv: " + where + ": microbatch " +
                                std::to_string(a.microbatch) + " outside [0, " +
                                std::to_string(s.microbatches) + ")");
}

// Places a (ready) and its SEND, and the matching RECV on the receiver.
void place(const Schedule& s, int rank, const Action& a, const ActivationShape& shape,
           Placed& placed, std::vector<std::vector<Action>>& out) {
  out[rank].push_back(a);
  if (is_marker(a.op)) return;
  const int st = a.stage;
  const int mb = a.microbatch;
  if (a.op == Op::forward) placed.forward[placed.at(st, mb)] = 1;
  if (a.op == Op::backward || a.op == Op::backward_input) placed.backward_in[placed.at(st, mb)] = 1;
  if (a.op == Op::forward && st + 1 < s.stages && s.stage_rank[st + 1] != rank) {
    out[rank].push_back(Action{Op::send_f, st, mb, st + 1, shape});
    out[s.stage_rank[st + 1]].push_back(Action{Op::recv_f, st + 1, mb, st, shape});
    placed.recv_f[placed.at(st + 1, mb)] = 1;
  }
  if ((a.op == Op::backward || a.op == Op::backward_input) && st > 0 &&
      s.stage_rank[st - 1] != rank) {
    out[rank].push_back(Action{Op::send_b, st, mb, st - 1, shape});
    out[s.stage_rank[st - 1]].push_back(Action{Op::recv_b, st - 1, mb, st, shape});
    placed.recv_b[placed.at(st - 1, mb)] = 1;
  }
}

}  // namespace

const char* op_name(Op op) {
  for (const auto& sp : kSpellings)
    if (sp.op == op) return sp.name;
  return "?";
}

bool is_compute(Op op) {
  return op == Op::forward || op == Op::backward || op == Op::backward_input ||
         op == Op::backward_weight;
}
bool is_comm(Op op) {
  return op == Op::send_f || op == Op::recv_f || op == Op::send_b || op == Op::recv_b;
}
bool is_marker(Op op) {
  return op == Op::unshard || op == Op::reshard || op == Op::reduce_grad;
}

std::string to_string(const ActivationShape& s) {
  return "[" + std::to_string(s.batch) + ", " + std::to_string(s.seq) + ", " +
         std::to_string(s.hidden) + "]";
}

std::string to_string(const Action& a) {
  std::string s = std::to_string(a.stage) + op_name(a.op);
  if (!is_marker(a.op)) s += std::to_string(a.microbatch);
  return s;
}

int default_peer_stage(Op op, int stage) {
  if (op == Op::send_f || op == Op::recv_b) return stage + 1;
  if (op == Op::recv_f || op == Op::send_b) return stage - 1;
  return -1;
}

Action parse_action(std::string_view text, const ActivationShape& shape) {
  const std::string_view t = trim(text);
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("pipeline action '" + std::string(t) + "': " + why);
  };
  if (!t.empty() && t.front() == '(')
    throw bad("OVERLAP_F_B actions (sub-action lists) are not supported");
  std::size_t pos = 0;
  const int stage = read_number(t, pos, t);
  if (stage < 0) throw bad("expected [stage][op][microbatch], e.g. 2F0");
  const OpSpelling* found = nullptr;
  for (const auto& sp : kSpellings)
    if (t.substr(pos).starts_with(sp.name)) {
      found = &sp;
      break;
    }
  if (found == nullptr)
    throw bad(
        "unknown op (expected F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD "
        "or REDUCE_GRAD)");
  pos += std::string_view(found->name).size();
  const int mb = read_number(t, pos, t);
  if (pos != t.size()) throw bad("trailing characters after the microbatch");
  if (is_marker(found->op) && mb >= 0) throw bad("a marker takes no microbatch");
  if (!is_marker(found->op) && mb < 0) throw bad("missing the microbatch number");
  Action a{found->op, stage, mb, -1, {}};
  if (is_comm(a.op)) {
    a.peer_stage = default_peer_stage(a.op, stage);
    a.shape = shape;
  }
  return a;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::gpipe:
      return "gpipe";
    case Kind::one_f_one_b:
      return "1f1b";
    case Kind::interleaved_1f1b:
      return "interleaved-1f1b";
    case Kind::zb_h1:
      return "zb-h1";
  }
  return "?";
}

Kind parse_kind(std::string_view name) {
  for (const Kind k : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved_1f1b, Kind::zb_h1})
    if (name == kind_name(k)) return k;
  throw std::invalid_argument("unknown pipeline schedule '" + std::string(name) +
                              "' (expected gpipe, 1f1b, interleaved-1f1b or zb-h1)");
}

std::optional<std::string> refusal(const ScheduleSpec& spec) {
  const std::string name = kind_name(spec.kind);
  const int p = spec.ranks;
  const int m = spec.microbatches;
  const int v = spec.virtual_stages;
  if (p < 1) return name + ": pp ranks p=" + std::to_string(p) + " must be at least 1";
  if (m < 1) return name + ": microbatches m=" + std::to_string(m) + " must be at least 1";
  if (spec.kind == Kind::interleaved_1f1b) {
    if (v < 2)
      return name + ": virtual stages v=" + std::to_string(v) +
             " must be at least 2 (v = 1 is 1f1b)";
    const int rounds = std::max(1, m / p);
    if (m % rounds != 0)
      return name + ": microbatches m=" + std::to_string(m) + " is not a multiple of the " +
             std::to_string(rounds) + " rounds max(1, floor(m/p)) with p=" + std::to_string(p) +
             " (PyTorch's ScheduleInterleaved1F1B rule: every round holds m/rounds microbatches)";
  } else if (v != 1) {
    return name + ": virtual stages v=" + std::to_string(v) +
           " must be 1 (only interleaved-1f1b runs several stages per rank)";
  }
  return std::nullopt;
}

Schedule make_compute_schedule(const ScheduleSpec& spec) {
  if (const auto why = refusal(spec)) throw std::invalid_argument(*why);
  Schedule s;
  s.name = kind_name(spec.kind);
  s.ranks = spec.ranks;
  s.stages = spec.ranks * spec.virtual_stages;
  s.microbatches = spec.microbatches;
  for (int k = 0; k < s.stages; ++k) s.stage_rank.push_back(k % s.ranks);
  const int p = spec.ranks;
  const int m = spec.microbatches;
  for (int r = 0; r < p; ++r) {
    switch (spec.kind) {
      case Kind::gpipe:
        s.actions.push_back(gpipe_rank(r, m));
        break;
      case Kind::one_f_one_b:
        s.actions.push_back(one_f_one_b_rank(r, p, m));
        break;
      case Kind::interleaved_1f1b:
        s.actions.push_back(interleaved_rank(r, p, m, spec.virtual_stages));
        break;
      case Kind::zb_h1:
        s.actions.push_back(zb_h1_rank(r, p, m));
        break;
    }
  }
  return s;
}

Schedule make_schedule(const ScheduleSpec& spec) {
  return lower_send_recv(make_compute_schedule(spec), spec.shape);
}

Schedule lower_send_recv(const Schedule& in, const ActivationShape& shape) {
  for (int r = 0; r < in.ranks; ++r)
    for (std::size_t i = 0; i < in.actions[r].size(); ++i)
      check_compute_action(in, r, i, in.actions[r][i]);
  Schedule s = in;
  for (auto& list : s.actions) list.clear();
  Placed placed(in.stages, in.microbatches);
  std::vector<std::size_t> next(in.ranks, 0);
  for (;;) {
    bool progress = false;
    bool finished = true;
    for (int r = 0; r < in.ranks; ++r) {
      if (next[r] == in.actions[r].size()) continue;
      finished = false;
      const Action& a = in.actions[r][next[r]];
      if (!waiting_for(in, r, a, placed).empty()) continue;
      place(in, r, a, shape, placed, s.actions);
      ++next[r];
      progress = true;
    }
    if (finished) return s;
    if (!progress) {
      std::string why = "lower_send_recv: the compute order cannot proceed:";
      for (int r = 0; r < in.ranks; ++r) {
        if (next[r] == in.actions[r].size()) continue;
        const Action& a = in.actions[r][next[r]];
        why += " rank " + std::to_string(r) + " action " + std::to_string(next[r]) + " (" +
               to_string(a) + ", stage " + std::to_string(a.stage) + ", microbatch " +
               std::to_string(a.microbatch) + ") waits for " + waiting_for(in, r, a, placed) + ";";
      }
      why.pop_back();
      throw std::invalid_argument(why);
    }
  }
}

Schedule compute_only(const Schedule& in) {
  Schedule s = in;
  for (auto& list : s.actions) std::erase_if(list, [](const Action& a) { return is_comm(a.op); });
  return s;
}

}  // namespace tspemu::pipeline
