#include "tspemu/tsp/baseline_shape.hpp"

#include <stdexcept>

#include "tspemu/plan/strategy_table.hpp"

namespace tspemu::tsp {

namespace {
std::string s(int v) {
  return std::to_string(v);
}

// The table's entry whose rules are this mesh's: Megatron-SP (whatever Sp), else by the degrees.
cost::Strategy mesh_strategy(const BaselineShape& b) {
  if (b.sequence_parallel) return {cost::Scheme::megatron_sp, 1, b.T, b.Sp};
  if (b.Sp == 1) return cost::Strategy::tp(b.T);
  if (b.T == 1) return cost::Strategy::sp(b.Sp);
  return cost::Strategy::tp_sp(b.T, b.Sp);
}
}  // namespace

BaselineShape BaselineShape::tp(const ref::ModelConfig& m, int D, int B, int S) {
  return {.model = m, .T = D, .Sp = 1, .B = B, .S = S, .sequence_parallel = false};
}
BaselineShape BaselineShape::megatron_sp(const ref::ModelConfig& m, int D, int B, int S) {
  return {.model = m, .T = D, .Sp = 1, .B = B, .S = S, .sequence_parallel = true};
}
BaselineShape BaselineShape::sp(const ref::ModelConfig& m, int D, int B, int S) {
  return {.model = m, .T = 1, .Sp = D, .B = B, .S = S, .sequence_parallel = false};
}
BaselineShape BaselineShape::tp_sp(const ref::ModelConfig& m, int T, int Sp, int B, int S) {
  return {.model = m, .T = T, .Sp = Sp, .B = B, .S = S, .sequence_parallel = false};
}

std::string BaselineShape::strategy() const {
  if (sequence_parallel) return Sp == 1 ? "TP+Megatron-SP" : "TP+Megatron-SP+SP";
  if (Sp == 1) return "TP";
  if (T == 1) return "SP";
  return "TP+SP";
}

void BaselineShape::validate() const {
  check(false);
}

void BaselineShape::validate_whole_model() const {
  check(true);
}

void BaselineShape::check(bool whole_model) const {
  const std::string who = strategy() + " config: ";
  auto reject = [&](const std::string& why) { throw std::invalid_argument(who + why); };
  model.validate();
  if (T < 1) reject("T=" + s(T) + " must be >= 1");
  if (Sp < 1) reject("Sp=" + s(Sp) + " must be >= 1");
  if (B < 1) reject("B=" + s(B) + " must be >= 1");
  if (S < 1) reject("S=" + s(S) + " must be >= 1");
  if (const auto v = violation(cost::ModelShape::from(model, B, S), mesh_strategy(*this),
                               {.whole_model = whole_model}))
    reject(v->message);
}

SequenceLayout BaselineShape::row_layout() const {
  return SequenceLayout(Sp > 1 ? LayoutKind::zigzag : LayoutKind::contiguous, Sp, S);
}

std::vector<std::int64_t> BaselineShape::positions(int rank) const {
  const SequenceLayout rl = row_layout();
  const int r = row(rank);
  std::vector<std::int64_t> p(static_cast<std::size_t>(rows()));
  const int first = sequence_parallel ? col(rank) * rows() : 0;
  for (int i = 0; i < rows(); ++i) p[static_cast<std::size_t>(i)] = rl.position(r, first + i);
  return p;
}

TspShape BaselineShape::shard_shape() const {
  TspShape t;
  t.model = model;
  t.D = T;
  t.B = B;
  t.S = S;
  return t;
}

}  // namespace tspemu::tsp
