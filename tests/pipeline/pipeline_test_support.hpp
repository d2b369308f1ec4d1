// The pipeline tests' shared pieces: a small model, a batch, a pipelined step run on a World of
// dp × pp ranks, and the one-thread microbatch reference it must equal bitwise — the same
// DenseStage calls, every microbatch's forward and input-gradient pass in order, then each
// stage's weight-gradient passes in the order that stage's B/W actions have in the schedule, the
// tied embedding summed first + last, the dp replicas summed in rank order.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tspemu/pipeline/dense_stage.hpp"
#include "tspemu/pipeline/executor.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::pipeline::testing {

struct PipeSetup {
  Kind kind = Kind::one_f_one_b;
  int p = 2;
  int m = 2;
  int v = 1;
  int dp = 1;
  bool tied = false;
  int layers = 8;
  int micro_batch = 1;  // sequences per microbatch
  int seq = 8;
  std::string label() const {
    return std::string(kind_name(kind)) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
           " v=" + std::to_string(v) + " dp=" + std::to_string(dp) + (tied ? " tied" : "");
  }
};

inline ref::ModelConfig small_config(const PipeSetup& s) {
  ref::ModelConfig c;
  c.vocab = 32;
  c.hidden = 16;
  c.n_layers = s.layers;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn = 24;
  c.tie_embeddings = s.tied;
  c.validate();
  return c;
}

// The global batch: dp · m · micro_batch sequences of seq tokens, replica d's the d-th slice.
struct Data {
  int B = 0, T = 0;
  std::vector<std::int32_t> tokens, targets;
  ref::Batch batch() const { return {B, T, tokens, targets, {}}; }
  ref::Batch replica(int d, int dp) const {
    const std::size_t n = tokens.size() / std::size_t(dp);
    return {B / dp,
            T,
            std::span<const std::int32_t>(tokens).subspan(std::size_t(d) * n, n),
            std::span<const std::int32_t>(targets).subspan(std::size_t(d) * n, n),
            {}};
  }
};

inline Data make_data(const PipeSetup& s, int vocab, std::uint64_t seed = 7) {
  Data d;
  d.B = s.dp * s.m * s.micro_batch;
  d.T = s.seq;
  ref::SplitMix64 rng(seed);
  for (int i = 0; i < d.B * d.T; ++i) {
    d.tokens.push_back(std::int32_t(rng.next() % std::uint64_t(vocab)));
    d.targets.push_back(std::int32_t(rng.next() % std::uint64_t(vocab)));
  }
  return d;
}

inline Schedule make(const PipeSetup& s) {
  return make_schedule({s.kind, s.p, s.m, s.v, {s.micro_batch, s.seq, 16}});
}

// A stage that delegates every call to a dense stage; a test overrides one call to plant a bug.
class WrappedStage : public Stage<float> {
 public:
  explicit WrappedStage(std::unique_ptr<DenseStage<float>> inner) : inner_(std::move(inner)) {}
  DenseStage<float>* dense() { return inner_.get(); }
  const StageSpan& span() const override { return inner_->span(); }
  std::size_t activation_elements() const override { return inner_->activation_elements(); }
  double forward(int j, const ref::Batch& mb, std::span<const float> x,
                 std::span<float> y) override {
    return inner_->forward(j, mb, x, y);
  }
  void backward_input(int j, const ref::Batch& mb, std::span<const float> dy, std::span<float> dx,
                      double loss_scale) override {
    inner_->backward_input(j, mb, dy, dx, loss_scale);
  }
  void backward_weight(int j) override { inner_->backward_weight(j); }
  std::vector<GradTensor<float>> gradients() override { return inner_->gradients(); }
  std::vector<float>* tied_part(bool head) override { return inner_->tied_part(head); }

 private:
  std::unique_ptr<DenseStage<float>> inner_;
};

// Per-microbatch records, keyed in dataflow order: (microbatch, phase, position, tensor) with
// phase 0 = a stage's output activation (position = stage), 1 = its input gradient (position =
// stages - 1 - stage), 2 = its accumulated gradient tensors after adding this microbatch.
using RecordKey = std::tuple<int, int, int, std::string>;
using Records = std::map<RecordKey, std::vector<float>>;

inline void record_output(Records& r, int stages, int stage, int mb, bool backward,
                          std::span<const float> t) {
  if (t.empty()) return;
  r[{mb, backward ? 1 : 0, backward ? stages - 1 - stage : stage,
     backward ? "input gradient" : "output activation"}] = {t.begin(), t.end()};
}

inline void record_gradients(Records& r, int stages, int stage, int mb, Stage<float>& st) {
  for (const GradTensor<float>& g : st.gradients())
    r[{mb, 2, stages - 1 - stage, "accumulated " + g.name}] = *g.data;
}

// The first record where the pipelined run and the reference differ, named by stage,
// microbatch and tensor with both values, or "".
inline std::string first_record_difference(const Records& got, const Records& want, int stages) {
  for (const auto& [key, w] : want) {
    const int mb = std::get<0>(key), phase = std::get<1>(key), pos = std::get<2>(key);
    const int stage = phase == 0 ? pos : stages - 1 - pos;
    const std::string where = "stage " + std::to_string(stage) + ", microbatch " +
                              std::to_string(mb) + ", tensor " + std::get<3>(key);
    auto it = got.find(key);
    if (it == got.end()) return where + ": not computed by the pipelined run";
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (std::memcmp(&w[i], &it->second[i], sizeof(float)) == 0) continue;
      std::ostringstream o;
      o << where << "[" << i << "]: pipelined " << it->second[i] << ", reference " << w[i]
        << " (ratio " << it->second[i] / w[i] << ")";
      return o.str();
    }
  }
  return "";
}

// What a step gives back: every dp replica's microbatch losses (unscaled), replica 0's gradients
// assembled from its stages, and each rank's arena.
struct StepResult {
  std::vector<std::vector<double>> losses;  // replica -> microbatch -> loss
  ref::ModelWeights<float> grads;
  std::vector<ArenaStats> arena;      // world rank -> its arena after the step
  std::vector<double> sim_seconds;    // world rank -> simulated clock at the end
  std::vector<double> sim_compute;    // world rank -> simulated compute seconds
  std::vector<std::string> failures;  // world rank -> what it threw ("" if nothing)
  Records records;                    // replica 0's, per microbatch
};

inline std::unique_ptr<DenseStage<float>> dense(const ref::ModelWeights<float>& w, StageSpan span,
                                                Arena& arena, const PipeSetup& s) {
  return std::make_unique<DenseStage<float>>(w, span, s.micro_batch, s.seq, arena);
}

// A stage the executor runs and the dense stage that holds its gradients (the same object unless
// a test wraps the dense stage to plant a bug).
struct HeldStage {
  std::unique_ptr<Stage<float>> stage;
  DenseStage<float>* dense = nullptr;
};
using StageFactory =
    std::function<HeldStage(const ref::ModelWeights<float>&, StageSpan, Arena&, const PipeSetup&)>;

inline HeldStage dense_held(const ref::ModelWeights<float>& w, StageSpan span, Arena& arena,
                            const PipeSetup& s) {
  auto d = dense(w, span, arena, s);
  DenseStage<float>* raw = d.get();
  return {std::move(d), raw};
}

// Runs one step of `schedule` on dp × p ranks (world rank = d·p + pp rank). Failures are caught
// per rank and returned, so a test can assert on the message.
inline StepResult run_step(const PipeSetup& s, const Schedule& schedule,
                           const ref::ModelWeights<float>& w, const Data& data,
                           const WorldOptions& base = {}, std::optional<Costs> costs = {},
                           const StageFactory& factory = dense_held) {
  WorldOptions wo = base;
  wo.ranks = s.dp * s.p;
  World world(wo);
  StepResult out;
  out.losses.assign(std::size_t(s.dp), {});
  out.failures.assign(std::size_t(wo.ranks), "");
  std::vector<std::vector<HeldStage>> held(std::size_t(wo.ranks));
  std::vector<Records> records(std::size_t(s.p));
  world.run([&](Rank& r) {
    const int d = r.id() / s.p, q = r.id() % s.p;
    Comm pp = r.comm().split(d, r.id(), "pp");
    Comm dpc = r.comm().split(q, r.id(), "dp");
    const ref::Batch replica = data.replica(d, s.dp);
    const std::vector<ref::Batch> mbs = cut_microbatches(replica, s.m);
    auto& mine = held[std::size_t(r.id())];
    std::vector<Stage<float>*> ptrs;
    for (int k = 0; k < schedule.stages; ++k) {
      if (schedule.stage_rank[std::size_t(k)] != q) continue;
      mine.push_back(factory(w, stage_span(w.config.n_layers, schedule.stages, k), r.arena(), s));
      ptrs.push_back(mine.back().stage.get());
    }
    Records& rec = records[std::size_t(q)];
    const ActionObserver<float> observe = [&rec, &schedule, d](const Action& a, Stage<float>& st,
                                                               std::span<const float> t) {
      if (d != 0) return;
      record_output(rec, schedule.stages, a.stage, a.microbatch, a.op != Op::forward, t);
      if (a.op == Op::backward || a.op == Op::backward_weight)
        record_gradients(rec, schedule.stages, a.stage, a.microbatch, st);
    };
    PipelineOptions opt;
    opt.tied_embeddings = s.tied;
    opt.dp = s.dp;
    opt.uniform_costs = costs;
    opt.flops_per_unit = 1e8;
    try {
      PipelineStepResult res =
          run_pipeline<float>(r, pp, s.dp > 1 ? &dpc : nullptr, schedule, mbs, ptrs, opt, observe);
      if (!res.losses.empty()) out.losses[std::size_t(d)] = res.losses;
    } catch (const std::exception& e) {
      out.failures[std::size_t(r.id())] = e.what();
    }
  });
  out.grads = ref::ModelWeights<float>::zeros(w.config);
  for (int q = 0; q < s.p; ++q) {
    for (auto& st : held[std::size_t(q)]) st.dense->export_gradients(out.grads);
    out.records.merge(records[std::size_t(q)]);
  }
  for (int r = 0; r < wo.ranks; ++r) {
    out.arena.push_back(world.arena(r).stats());
    out.sim_seconds.push_back(world.simulated_seconds(r));
    out.sim_compute.push_back(world.simulated_time(r).compute);
  }
  return out;
}

// The microbatch reference: one thread, the same DenseStage calls in each stage's schedule order.
struct ReferenceResult {
  std::vector<std::vector<double>> losses;
  ref::ModelWeights<float> grads;
  Records records;  // replica 0's
};

// The microbatches whose weight gradients stage k accumulates, in the schedule's order.
inline std::vector<int> accumulation_order(const Schedule& s, int k) {
  std::vector<int> order;
  for (const Action& a : s.actions[std::size_t(s.stage_rank[std::size_t(k)])]) {
    if (a.stage == k && (a.op == Op::backward || a.op == Op::backward_weight))
      order.push_back(a.microbatch);
  }
  return order;
}

inline ref::ModelWeights<float> replica_reference(const PipeSetup& s, const Schedule& schedule,
                                                  const ref::ModelWeights<float>& w,
                                                  const ref::Batch& replica,
                                                  std::vector<double>& losses,
                                                  Records* records = nullptr) {
  Arena arena(0, std::size_t{1} << 30);
  const int S = schedule.stages;
  std::vector<std::unique_ptr<DenseStage<float>>> st;
  for (int k = 0; k < S; ++k) st.push_back(dense(w, stage_span(w.config.n_layers, S, k), arena, s));
  const std::vector<ref::Batch> mbs = cut_microbatches(replica, s.m);
  const std::size_t n = st[0]->activation_elements();
  const double scale = 1.0 / (double(s.m) * double(s.dp));
  losses.assign(std::size_t(s.m), 0.0);
  for (int j = 0; j < s.m; ++j) {
    std::vector<float> x, y(n), dy, dx(n);
    for (int k = 0; k < S; ++k) {
      const bool last = k + 1 == S;
      const double loss =
          st[std::size_t(k)]->forward(j, mbs[std::size_t(j)], x, last ? std::span<float>() : y);
      if (last) losses[std::size_t(j)] = loss;
      if (records && !last) record_output(*records, S, k, j, false, y);
      x = y;
    }
    for (int k = S; k-- > 0;) {
      st[std::size_t(k)]->backward_input(j, mbs[std::size_t(j)], dy,
                                         k == 0 ? std::span<float>() : dx, scale);
      if (records && k > 0) record_output(*records, S, k, j, true, dx);
      dy = dx;
    }
  }
  ref::ModelWeights<float> g = ref::ModelWeights<float>::zeros(w.config);
  for (int k = 0; k < S; ++k) {
    for (int j : accumulation_order(schedule, k)) {
      st[std::size_t(k)]->backward_weight(j);
      if (records) record_gradients(*records, S, k, j, *st[std::size_t(k)]);
    }
  }
  if (s.tied) {
    std::vector<float>& e = *st.front()->tied_part(false);
    std::vector<float>& h = *st.back()->tied_part(true);
    for (std::size_t i = 0; i < e.size(); ++i) e[i] = e[i] + h[i];
    h = e;
  }
  for (auto& stage : st) stage->export_gradients(g);
  return g;
}

inline ReferenceResult microbatch_reference(const PipeSetup& s, const Schedule& schedule,
                                            const ref::ModelWeights<float>& w, const Data& data) {
  ReferenceResult out;
  out.losses.assign(std::size_t(s.dp), {});
  for (int d = 0; d < s.dp; ++d) {
    ref::ModelWeights<float> g =
        replica_reference(s, schedule, w, data.replica(d, s.dp), out.losses[std::size_t(d)],
                          d == 0 ? &out.records : nullptr);
    if (d == 0) {
      out.grads = std::move(g);
      continue;
    }
    // all_reduce's order: ((g_0 + g_1) + g_2) + ...
    auto acc = ref::parameters(out.grads);
    auto add = ref::parameters(g);
    for (std::size_t t = 0; t < acc.size(); ++t) {
      for (std::size_t i = 0; i < acc[t].data->size(); ++i) (*acc[t].data)[i] += (*add[t].data)[i];
    }
  }
  return out;
}

// The first element where a and b differ in bits, named, or "" when bitwise equal.
inline std::string first_bit_difference(const ref::ModelWeights<float>& a,
                                        const ref::ModelWeights<float>& b) {
  const auto pa = ref::parameters(a);
  const auto pb = ref::parameters(b);
  for (std::size_t t = 0; t < pa.size(); ++t) {
    const std::vector<float>& x = *pa[t].data;
    const std::vector<float>& y = *pb[t].data;
    if (x.size() != y.size()) return pa[t].name + ": sizes differ";
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) {
        std::ostringstream o;
        o << pa[t].name << "[" << i << "]: " << std::hexfloat << x[i] << " vs " << y[i];
        return o.str();
      }
    }
  }
  return "";
}

}  // namespace tspemu::pipeline::testing
