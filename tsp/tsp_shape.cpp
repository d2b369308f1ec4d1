#include "tspemu/tsp/tsp_shape.hpp"

#include <stdexcept>
#include <string>

#include "tspemu/plan/strategy_table.hpp"

namespace tspemu::tsp {

namespace {
[[noreturn]] void reject(const std::string& why) {
  throw std::invalid_argument("TSP config: " + why);
}
std::string s(int v) {
  return std::to_string(v);
}
}  // namespace

void TspShape::validate() const {
  check(false);
}

void TspShape::validate_whole_model() const {
  check(true);
}

void TspShape::check(bool whole_model) const {
  model.validate();
  if (D < 1) reject("D=" + s(D) + " must be >= 1");
  if (B < 1) reject("B=" + s(B) + " must be >= 1");
  if (S < 1) reject("S=" + s(S) + " must be >= 1");
  const RuleOptions rules{.tsp_layout = options.layout,
                          .head_buckets = options.head_buckets,
                          .whole_model = whole_model};
  if (const auto v = violation(cost::ModelShape::from(model, B, S), cost::Strategy::tsp(D), rules))
    reject(v->message);
}

}  // namespace tspemu::tsp
