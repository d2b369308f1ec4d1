#include "pipeline_messages.hpp"

#include <cstddef>

namespace tspemu::pipeline::detail {

namespace {

// The RECV_F / RECV_B of (stage, microbatch) -> its index on the stage's rank.
struct RecvIndex {
  int m = 0;
  std::vector<int> at;
  RecvIndex(int stages, int microbatches)
      : m(microbatches), at(static_cast<std::size_t>(2) * stages * microbatches, -1) {}
  int& operator()(Op op, int stage, int mb) {
    return at[(static_cast<std::size_t>(stage) * 2 + (op == Op::recv_b ? 1 : 0)) * m + mb];
  }
};

}  // namespace

Messages link_messages(const Schedule& s) {
  const int p = s.ranks;
  Messages out;
  std::vector<std::vector<int>> sends(static_cast<std::size_t>(p) * p);
  std::vector<std::vector<int>> recvs(sends.size());
  RecvIndex recv_at(s.stages, s.microbatches);
  for (int r = 0; r < p; ++r) {
    const auto& list = s.actions[r];
    out.other_end.emplace_back(list.size());
    out.consumes.emplace_back(list.size(), -1);
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      if (a.op == Op::send_f || a.op == Op::send_b)
        sends[r * p + s.stage_rank[a.peer_stage]].push_back(i);
      if (a.op == Op::recv_f || a.op == Op::recv_b) {
        recvs[s.stage_rank[a.peer_stage] * p + r].push_back(i);
        recv_at(a.op, a.stage, a.microbatch) = i;
      }
    }
  }
  for (int from = 0; from < p; ++from)
    for (int to = 0; to < p; ++to) {
      const auto& sd = sends[from * p + to];
      const auto& rv = recvs[from * p + to];
      for (std::size_t k = 0; k < sd.size() && k < rv.size(); ++k) {
        out.other_end[from][sd[k]] = {to, rv[k]};
        out.other_end[to][rv[k]] = {from, sd[k]};
      }
    }
  for (int r = 0; r < p; ++r)
    for (int i = 0; i < static_cast<int>(s.actions[r].size()); ++i) {
      const Action& a = s.actions[r][i];
      const int k = a.stage;
      if (a.op == Op::forward && k > 0 && s.stage_rank[k - 1] != r)
        out.consumes[r][i] = recv_at(Op::recv_f, k, a.microbatch);
      if ((a.op == Op::backward || a.op == Op::backward_input) && k + 1 < s.stages &&
          s.stage_rank[k + 1] != r)
        out.consumes[r][i] = recv_at(Op::recv_b, k, a.microbatch);
    }
  return out;
}

}  // namespace tspemu::pipeline::detail
