#include "tspemu/pipeline/executor.hpp"

#include <deque>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "tspemu/runtime/all_reduce.hpp"
#include "tspemu/runtime/send_recv.hpp"
#include "tspemu/runtime/trace.hpp"

namespace tspemu::pipeline {

namespace {

// The mailbox admits this many messages in flight per ordered pair (send_recv.hpp).
constexpr std::size_t kSendsInFlight = 4;

using Key = std::pair<int, int>;  // (stage, microbatch)

std::string where(int stage, int microbatch) {
  return "stage " + std::to_string(stage) + " microbatch " + std::to_string(microbatch);
}

template <class T>
class Executor {
 public:
  Executor(Rank& rank, Comm& pp, const Schedule& s, std::span<const ref::Batch> mbs,
           std::span<Stage<T>* const> stages, const PipelineOptions& opt,
           const ActionObserver<T>& observe)
      : rank_(rank), pp_(pp), s_(s), mbs_(mbs), opt_(opt), observe_(observe) {
    for (Stage<T>* st : stages) stages_[st->span().stage] = st;
    for (int k = 0; k < s.stages; ++k) {
      if (s.stage_rank[std::size_t(k)] == pp.rank() && !stages_.count(k))
        throw std::invalid_argument("run_pipeline: pp rank " + std::to_string(pp.rank()) +
                                    " was not given stage " + std::to_string(k));
    }
    if (stages_.size() != stages.size() || int(mbs.size()) != s.microbatches)
      throw std::invalid_argument(
          "run_pipeline: pp rank " + std::to_string(pp.rank()) + " has " +
          std::to_string(stages.size()) + " stages (distinct: " + std::to_string(stages_.size()) +
          ") and " + std::to_string(mbs.size()) + " microbatches for a schedule of " +
          std::to_string(s.microbatches));
  }

  PipelineStepResult run() {
    for (const Action& a : s_.actions[std::size_t(pp_.rank())]) step(a);
    for (auto& [peer, q] : sends_) {
      for (auto& p : q) p.handle.wait();
    }
    sends_.clear();
    require_consumed(recv_f_, "a received activation was never consumed");
    require_consumed(recv_b_, "a received gradient was never consumed");
    require_consumed(out_f_, "an output was never sent or consumed");
    require_consumed(out_b_, "an input gradient was never sent or consumed");
    PipelineStepResult r;
    if (!losses_.empty()) r.losses = std::move(losses_);
    return r;
  }

 private:
  struct Pending {
    Buffer<T> buf;
    RecvHandle handle;
  };
  struct InFlight {
    Buffer<T> buf;
    SendHandle handle;
  };

  Stage<T>& stage(int k) {
    auto it = stages_.find(k);
    if (it == stages_.end())
      throw std::logic_error("run_pipeline: pp rank " + std::to_string(pp_.rank()) +
                             " does not hold stage " + std::to_string(k));
    return *it->second;
  }
  int rank_of(int stage) const { return s_.stage_rank[std::size_t(stage)]; }
  bool local(int stage) const {
    return stage >= 0 && stage < s_.stages && rank_of(stage) == pp_.rank();
  }

  template <class Map>
  void require_consumed(const Map& m, const char* what) const {
    if (m.empty()) return;
    const Key k = m.begin()->first;
    throw std::logic_error("run_pipeline: pp rank " + std::to_string(pp_.rank()) + ", " +
                           where(k.first, k.second) + ": " + what);
  }

  void step(const Action& a) {
    switch (a.op) {
      case Op::recv_f:
        post_recv(recv_f_, a);
        return;
      case Op::recv_b:
        post_recv(recv_b_, a);
        return;
      case Op::send_f:
        post_send(out_f_, a);
        return;
      case Op::send_b:
        post_send(out_b_, a);
        return;
      case Op::forward:
        forward(a);
        return;
      case Op::backward:
      case Op::backward_input:
        backward_input(a);
        return;
      case Op::backward_weight:
        backward_weight(a);
        return;
      case Op::unshard:
      case Op::reshard:
      case Op::reduce_grad:
        return;
    }
  }

  void post_recv(std::map<Key, Pending>& into, const Action& a) {
    const std::size_t n = stage(a.stage).activation_elements();
    Pending p{rank_.arena().allocate<T>(n, Category::comm), {}};
    p.handle = irecv<T>(pp_, p.buf.span(), rank_of(a.peer_stage));
    into.emplace(Key{a.stage, a.microbatch}, std::move(p));
  }

  void post_send(std::map<Key, Buffer<T>>& from, const Action& a) {
    auto it = from.find({a.stage, a.microbatch});
    if (it == from.end())
      throw std::logic_error("run_pipeline: pp rank " + std::to_string(pp_.rank()) + ", " +
                             where(a.stage, a.microbatch) + ": " + to_string(a) +
                             " before the tensor it sends was computed");
    const int dst = rank_of(a.peer_stage);
    InFlight f{std::move(it->second), {}};
    from.erase(it);
    f.handle = isend<T>(pp_, std::span<const T>(f.buf.span()), dst);
    std::deque<InFlight>& q = sends_[dst];
    q.push_back(std::move(f));
    // The fifth isend to a peer returned once the oldest was received: it completes at once.
    while (q.size() > kSendsInFlight) {
      q.front().handle.wait();
      q.pop_front();
    }
  }

  // The tensor a compute action consumes: a received message (waited now) or, when its producer
  // stage is on this rank, that stage's kept output.
  Buffer<T> take(std::map<Key, Pending>& received, std::map<Key, Buffer<T>>& local_out,
                 int producer, int stage, int mb, const char* what) {
    if (local(producer)) {
      auto it = local_out.find({producer, mb});
      if (it == local_out.end())
        throw std::logic_error("run_pipeline: " + where(stage, mb) + ": its " + what +
                               " from stage " + std::to_string(producer) + " is not computed yet");
      Buffer<T> b = std::move(it->second);
      local_out.erase(it);
      return b;
    }
    auto it = received.find({stage, mb});
    if (it == received.end())
      throw std::logic_error("run_pipeline: " + where(stage, mb) + ": its " + what +
                             " was never received (no RECV before it)");
    it->second.handle.wait();
    Buffer<T> b = std::move(it->second.buf);
    received.erase(it);
    return b;
  }

  // Charges `units` of Costs on the simulated clock while alive (nothing without uniform_costs).
  std::optional<TraceSpan> charge(const char* name, std::int64_t units) const {
    if (!opt_.uniform_costs) return std::nullopt;
    return std::optional<TraceSpan>(std::in_place, pp_, name, double(units) * opt_.flops_per_unit);
  }

  void forward(const Action& a) {
    const int k = a.stage, mb = a.microbatch;
    Stage<T>& st = stage(k);
    Buffer<T> x;
    if (k > 0) x = take(recv_f_, out_f_, k - 1, k, mb, "input activation");
    Buffer<T> y;
    if (k + 1 < s_.stages) y = rank_.arena().allocate<T>(st.activation_elements(), Category::comm);
    double loss = 0;
    {
      auto span = charge("pipeline F", opt_.uniform_costs ? opt_.uniform_costs->forward : 0);
      loss = st.forward(mb, mbs_[std::size_t(mb)], x.span(), y.span());
    }
    if (observe_) observe_(a, st, y.span());
    if (k + 1 < s_.stages) {
      out_f_.emplace(Key{k, mb}, std::move(y));
    } else {
      if (losses_.empty()) losses_.assign(mbs_.size(), 0.0);
      losses_[std::size_t(mb)] = loss;
    }
  }

  void backward_input(const Action& a) {
    const int k = a.stage, mb = a.microbatch;
    const bool full = a.op == Op::backward;
    Stage<T>& st = stage(k);
    Buffer<T> dy;
    if (k + 1 < s_.stages) dy = take(recv_b_, out_b_, k + 1, k, mb, "output gradient");
    Buffer<T> dx;
    if (k > 0) dx = rank_.arena().allocate<T>(st.activation_elements(), Category::comm);
    const double scale = 1.0 / (double(s_.microbatches) * double(opt_.dp));
    {
      const Costs c = opt_.uniform_costs.value_or(Costs{});
      auto span = charge(full ? "pipeline B" : "pipeline I", full ? c.backward : c.backward_input);
      st.backward_input(mb, mbs_[std::size_t(mb)], dy.span(), dx.span(), scale);
      if (full) st.backward_weight(mb);
    }
    if (observe_) observe_(a, st, dx.span());
    if (k > 0) out_b_.emplace(Key{k, mb}, std::move(dx));
  }

  void backward_weight(const Action& a) {
    Stage<T>& st = stage(a.stage);
    {
      auto span =
          charge("pipeline W", opt_.uniform_costs ? opt_.uniform_costs->backward_weight : 0);
      st.backward_weight(a.microbatch);
    }
    if (observe_) observe_(a, st, {});
  }

  Rank& rank_;
  Comm& pp_;
  const Schedule& s_;
  std::span<const ref::Batch> mbs_;
  const PipelineOptions& opt_;
  const ActionObserver<T>& observe_;
  std::map<int, Stage<T>*> stages_;
  std::map<Key, Pending> recv_f_, recv_b_;     // (receiving stage, mb)
  std::map<Key, Buffer<T>> out_f_, out_b_;     // (producing stage, mb)
  std::map<int, std::deque<InFlight>> sends_;  // destination rank -> sends not yet waited
  std::vector<double> losses_;
};

// What the tensor an action computes or moves is, for messages: an F or SEND_F/RECV_F carries
// the stage's output activation, a B or I or SEND_B/RECV_B the activation gradient, a W the
// stage's weight gradients.
std::string tensor_of(const Action& a, const Schedule& s) {
  const std::string shape = " " + to_string(a.shape);
  switch (a.op) {
    case Op::forward:
      return "the output activation of stage " + std::to_string(a.stage) + shape;
    case Op::send_f:
    case Op::recv_f:
      return "the activation from stage " +
             std::to_string(a.op == Op::send_f ? a.stage : a.peer_stage) + shape;
    case Op::backward:
    case Op::backward_input:
      return "the input gradient of stage " + std::to_string(a.stage) + shape;
    case Op::send_b:
    case Op::recv_b:
      return "the activation gradient from stage " +
             std::to_string(a.op == Op::send_b ? a.stage : a.peer_stage) + shape;
    case Op::backward_weight:
      return "the weight gradients of stage " + std::to_string(a.stage);
    default:
      return "the gradients of stage " + std::to_string(a.stage) + " (" + std::to_string(s.stages) +
             " stages)";
  }
}

// The checker's verdict with the tensor the failing action carries named.
void require_runnable(const Schedule& s) {
  const std::optional<ScheduleIssue> issue = check_schedule(s, CheckOptions{int(kSendsInFlight)});
  if (!issue) return;
  std::string where = "run_pipeline: schedule refused before any message moved: ";
  if (issue->rank >= 0 && issue->index >= 0) {
    const Action& a = s.actions[std::size_t(issue->rank)][std::size_t(issue->index)];
    where += "pp rank " + std::to_string(issue->rank) + " action #" + std::to_string(issue->index) +
             " " + to_string(a) + " (stage " + std::to_string(a.stage) + ", microbatch " +
             std::to_string(a.microbatch) + ", tensor: " + tensor_of(a, s) + "): ";
  }
  throw std::invalid_argument(where + issue->message);
}

// The tied embedding: the first stage's and the last stage's parts both become first + last.
template <class T>
void reduce_tied(Comm& pp, const Schedule& s, const std::map<int, Stage<T>*>& mine) {
  const int first = s.stage_rank.front(), last = s.stage_rank.back();
  auto part = [&](int k, bool head) -> std::vector<T>& {
    auto it = mine.find(k);
    std::vector<T>* p = it == mine.end() ? nullptr : it->second->tied_part(head);
    if (!p)
      throw std::invalid_argument("run_pipeline: tied embeddings, but stage " + std::to_string(k) +
                                  " has no " + (head ? "LM-head" : "embedding") + " gradient part");
    return *p;
  };
  if (first == last) {
    if (pp.rank() != first) return;
    std::vector<T>& e = part(0, false);
    std::vector<T>& h = part(s.stages - 1, true);
    for (std::size_t i = 0; i < e.size(); ++i) e[i] = e[i] + h[i];
    h = e;
    return;
  }
  const bool is_first = pp.rank() == first;
  if (!is_first && pp.rank() != last) return;
  std::vector<T>& mine_part = is_first ? part(0, false) : part(s.stages - 1, true);
  std::vector<T> other(mine_part.size());
  SendHandle sh = isend<T>(pp, std::span<const T>(mine_part), is_first ? last : first);
  recv<T>(pp, std::span<T>(other), is_first ? last : first);
  sh.wait();
  // first + last on both sides (float addition commutes: both get the same bits).
  for (std::size_t i = 0; i < other.size(); ++i)
    mine_part[i] = is_first ? mine_part[i] + other[i] : other[i] + mine_part[i];
}

}  // namespace

template <class T>
PipelineStepResult run_pipeline(Rank& rank, Comm& pp, Comm* dp, const Schedule& schedule,
                                std::span<const ref::Batch> microbatches,
                                std::span<Stage<T>* const> stages, const PipelineOptions& opt,
                                const ActionObserver<T>& observe) {
  if (pp.size() != schedule.ranks)
    throw std::invalid_argument("run_pipeline: the pp group has " + std::to_string(pp.size()) +
                                " ranks, the schedule " + std::to_string(schedule.ranks));
  if (opt.dp < 1 || (dp ? dp->size() : 1) != opt.dp)
    throw std::invalid_argument("run_pipeline: dp = " + std::to_string(opt.dp) +
                                " but the dp group has " + std::to_string(dp ? dp->size() : 1) +
                                " ranks");
  require_runnable(schedule);
  Executor<T> ex(rank, pp, schedule, microbatches, stages, opt, observe);
  PipelineStepResult r = ex.run();
  std::map<int, Stage<T>*> mine;
  for (Stage<T>* st : stages) mine[st->span().stage] = st;
  if (opt.tied_embeddings) reduce_tied<T>(pp, schedule, mine);
  if (dp && dp->size() > 1) {
    for (auto& [k, st] : mine) {
      for (GradTensor<T>& g : st->gradients()) all_reduce<T>(*dp, std::span<T>(*g.data));
    }
  }
  return r;
}

template PipelineStepResult run_pipeline<float>(Rank&, Comm&, Comm*, const Schedule&,
                                                std::span<const ref::Batch>,
                                                std::span<Stage<float>* const>,
                                                const PipelineOptions&,
                                                const ActionObserver<float>&);
template PipelineStepResult run_pipeline<double>(Rank&, Comm&, Comm*, const Schedule&,
                                                 std::span<const ref::Batch>,
                                                 std::span<Stage<double>* const>,
                                                 const PipelineOptions&,
                                                 const ActionObserver<double>&);

}  // namespace tspemu::pipeline
